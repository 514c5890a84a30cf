#include "fallback.h"

#include <algorithm>
#include <stdexcept>

#include "ngram.h"
#include "ssd/log.h"
#include "ssd/speed_model.h"

namespace ssd::runtime {

namespace {

// Running mean of a per-round quantity: the plain mean of the first
// `horizon` rounds, then weighted towards recent rounds (each new one 1 /
// horizon). An estimate started at a kind's first round and decayed by 0.9
// still held 0.9^9 of that round after ten, so one round decided which kind
// the next batches of misses got (batch 4: a fast kind whose first round
// kept 3 proposals stayed in force through four that kept none).
void ema(double& v, int64_t& n, double x, double horizon = 10.0) {
  ++n;
  v += (x - v) / std::min(static_cast<double>(n), horizon);
}

const char* name_of(FallbackKind kind) { return kind == FallbackKind::kFast ? "fast (n-gram)" : "neural"; }

}  // namespace

Fallback::Fallback(const EngineConfig& config, const FanoutPlanner& planner, PathDecoder* decoder, bool alternate)
    : config_(config), planner_(planner), decoder_(decoder), alternate_(alternate) {}

FallbackKind Fallback::choose(int64_t batch) {
  if (alternate_ && config_.fallback == "auto")
    return in_force_ = in_force_ == FallbackKind::kFast ? FallbackKind::kNeural : FallbackKind::kFast;
  const FallbackKind chosen = pick(batch);
  if (chosen != in_force_)
    SSD_LOG_INFO("ssd fallback: " << name_of(chosen) << " from now on (batch " << batch << ", hit rate " << hit_rate_
                                  << ", tokens per round: hit " << hit_tokens_ << ", fast " << fast_.tokens << " over "
                                  << fast_.rounds << ", neural " << neural_.tokens << " over " << neural_.rounds
                                  << "; time per verify: tree " << tree_time_ << ", fast " << fast_.time
                                  << ", neural " << neural_.time << ")");
  return in_force_ = chosen;
}

FallbackKind Fallback::pick(int64_t batch) const {
  if (config_.fallback == "neural") return FallbackKind::kNeural;
  if (config_.fallback == "fast") return FallbackKind::kFast;
  // "auto". The fast kind costs nothing to try, so it runs first until its
  // tokens per round are known. The neural kind drafts with the same model
  // and sampling as the tree, so until it has run, its tokens per round are
  // taken to be the hits' and its time K draft steps of the batch.
  constexpr int64_t kWarmup = 4;
  if (fast_.rounds < kWarmup) return FallbackKind::kFast;
  KindEstimate neural = neural_;
  const int64_t b = std::max<int64_t>(batch, 1);
  if (neural.rounds == 0) neural.tokens = hit_tokens_;
  if (neural.runs == 0 && verify_s_ > 0)
    neural.time = static_cast<double>(config_.k) * planner_.step_seconds(static_cast<double>(b)) / verify_s_;
  return predicted_speedup(fast_, b) >= predicted_speedup(neural, b) ? FallbackKind::kFast : FallbackKind::kNeural;
}

double Fallback::predicted_speedup(const KindEstimate& kind, int64_t batch) const {
  // With a batch, one miss anywhere delays the whole round; the speed model says how much.
  RoundModel m;
  m.p_hit = hit_rate_;
  m.e_hit = hit_tokens_;
  m.e_miss = kind.tokens;
  m.t_p = tree_time_;
  m.t_b = kind.time;
  m.batch = batch;
  return predict_round(m).speedup;
}

void Fallback::draft(FallbackKind kind, SpecSource source, std::vector<DraftSequence*>& seqs,
                     const std::vector<int64_t>& fanout, std::vector<Speculation>& out) {
  const int64_t K = config_.k;
  if (kind == FallbackKind::kFast) {
    for (DraftSequence* s : seqs) {
      s->propose(ngram_propose(s->tokens, K), {}, K, source);
      out.push_back(s->answer(source, {}, true));
    }
    return;
  }
  // The draft catches up on the committed tokens it has no KV for (all of
  // them after a start), then drafts K tokens.
  if (decoder_ == nullptr) throw std::logic_error("the neural fallback has no draft decoder");
  std::vector<DraftPath> paths;
  for (DraftSequence* s : seqs) {
    if (s->computed >= static_cast<int64_t>(s->tokens.size()))
      throw std::logic_error("draft state ahead of its sequence");
    paths.push_back(DraftPath::sampling(*s, s->table, s->computed,
                                        {s->tokens.begin() + s->computed, s->tokens.end()}, K));
  }
  decoder_->decode(paths, fanout, DraftForwards::kFallback);
  for (DraftPath& p : paths) {
    DraftSequence* s = p.seq;
    s->computed = static_cast<int64_t>(s->tokens.size()) - 1 + K;
    s->propose(std::move(p.out), std::move(p.ranked), K, source);
    out.push_back(s->answer(source, std::move(p.q), false));
  }
}

void Fallback::shadow(const std::vector<DraftSequence*>& seqs) const {
  for (DraftSequence* s : seqs)
    s->shadows.push_back({static_cast<int64_t>(s->tokens.size()), ngram_propose(s->tokens, config_.k)});
}

void Fallback::score_shadows(DraftSequence& s, DraftCounters& counters) {
  // Verifying a one-hot proposal accepts its next token with the target's
  // probability of that token, the probability that the target's own sample
  // there is that token. So the tokens a round verifying the n-gram proposal
  // would have emitted (agreeing prefix + 1) follow the same law when read
  // off the committed text: at any temperature, without running it.
  for (auto it = s.shadows.begin(); it != s.shadows.end();) {
    const int64_t emitted = proposal_emitted(s.tokens, it->at, it->tokens);
    if (emitted < 0) {  // the text agrees so far
      ++it;
      continue;
    }
    ema(fast_.tokens, fast_.rounds, static_cast<double>(emitted));
    counters.fast_shadow_rounds += 1;
    counters.fast_shadow_tokens += emitted;
    it = s.shadows.erase(it);
  }
}

void Fallback::observe_emitted(SpecSource source, int64_t accepted, bool tree_round) {
  // A treeless round (the adaptive policy's drafting without trees, or its
  // calibration round after autoregressive steps) is drafted by the draft
  // model from the committed text, as the neural kind answers a miss: its
  // tokens are the neural kind's (its run time is not; observe_run). Without
  // them the neural kind was priced at the hits' tokens until it first ran:
  // the adaptive engine's warm-up, whose first rounds were treeless, left it
  // untried, and the timed run tried it on 2-4 batches of misses that each
  // waited for it (MT-bench and HumanEval T 0, batch 4).
  const auto emitted = static_cast<double>(accepted + 1);
  if (source == SpecSource::kNeural) ema(neural_.tokens, neural_.rounds, emitted);
  if (!tree_round) return;
  if (source == SpecSource::kHit) hit_tokens_ = 0.9 * hit_tokens_ + 0.1 * emitted;
  if (source == SpecSource::kFast) ema(fast_.tokens, fast_.rounds, emitted);
}

void Fallback::observe_run(FallbackKind kind, double seconds, bool tree_round) {
  if (verify_s_ <= 0 || !tree_round) return;
  KindEstimate& est = of(kind);
  const double time = seconds / verify_s_;
  ema(est.time, est.runs, time, 5.0);
}

void Fallback::observe_tree(double seconds) {
  if (verify_s_ > 0) tree_time_ = 0.8 * tree_time_ + 0.2 * seconds / verify_s_;
}

double Fallback::tokens_estimate(FallbackKind kind) const {
  const KindEstimate& est = of(kind);
  return est.rounds > 0 ? est.tokens : 0.0;
}

}  // namespace ssd::runtime
