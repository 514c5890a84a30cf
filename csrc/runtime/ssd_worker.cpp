#include "ssd_worker.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "../kernels/cpu/kv_commit.h"
#include "../kernels/cpu/ops.h"
#include "draft_sampling.h"
#include "ssd/log.h"
#include "ssd/speed_model.h"
#include "ngram.h"

#include <ATen/core/Tensor.h>

namespace ssd::runtime {

namespace {

using WorkerClock = std::chrono::steady_clock;

double since(WorkerClock::time_point t) {
  return std::chrono::duration<double>(WorkerClock::now() - t).count();
}

/// The m best tokens of a logits row, ranked by (logit desc, id asc).
std::vector<int32_t> top_tokens(const float* logits, int64_t vocab, int64_t m) {
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(m + 1));
  for (int64_t t = 0; t < vocab; ++t) {
    const float z = logits[t];
    if (static_cast<int64_t>(best.size()) == m && !(z > logits[best.back()])) continue;
    auto pos = best.end();
    while (pos != best.begin() && z > logits[*(pos - 1)]) --pos;
    best.insert(pos, static_cast<int32_t>(t));
    if (static_cast<int64_t>(best.size()) > m) best.pop_back();
  }
  return best;
}

}  // namespace

/// A fork point's best draft tokens, ranked, with their probabilities under
/// the draft's distribution at temperature 1 (filled when asked for: the
/// confidence-ranked fan-out reads them).
struct DraftWorker::Ranked {
  std::vector<int32_t> tokens;
  std::vector<float> probs;

  bool empty() const { return tokens.empty(); }
  /// The probability of token t (0 when it is not listed or no probabilities were kept).
  double prob_of(int32_t t) const {
    for (size_t i = 0; i < tokens.size() && i < probs.size(); ++i)
      if (tokens[i] == t) return probs[i];
    return 0.0;
  }
  static Ranked of(const float* logits, int64_t vocab, int64_t m, bool with_probs) {
    Ranked r;
    r.tokens = top_tokens(logits, vocab, m);
    if (with_probs && !r.tokens.empty()) {
      const float top = logits[r.tokens[0]];
      const double total = kernels::sum_exp(logits, vocab, top);
      for (int32_t t : r.tokens) r.probs.push_back(static_cast<float>(std::exp(logits[t] - top) / total));
    }
    return r;
  }
};

namespace {

int64_t max_budget(const EngineConfig& c) {
  if (!c.fanout_list.empty()) {
    int64_t s = 0;
    for (int64_t f : c.fanout_list) s += f;
    return s;
  }
  return c.fanout_budget > 0 ? c.fanout_budget : 16;
}

// Running mean of a per-round quantity, weighted towards recent rounds.
void ema(double& v, int64_t& n, double x) { v = n++ == 0 ? x : 0.9 * v + 0.1 * x; }

}  // namespace

struct DraftWorker::Seq {
  struct Branch {
    int64_t j = 0;
    int32_t c = 0;
    model::BlockTable table;  // the first `shared` blocks are borrowed from the sequence
    int64_t shared = 0;
  };
  struct Entry {
    std::vector<int32_t> tokens;
    std::vector<float> q;
    std::vector<Ranked> ranked;
    size_t branch = 0;
  };

  RequestId id = 0;
  uint64_t epoch = 0;
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  // committed tokens (prompt + generated)
  model::BlockTable table;      // draft KV along tokens, then the outstanding speculation
  int64_t computed = 0;
  std::vector<int32_t> spec;    // the outstanding speculation; empty when none
  std::vector<Ranked> ranked;   // [K + 1] ranked draft tokens per fork point
  SpecSource source = SpecSource::kStart;
  bool treed = false;
  // The n-gram proposals the fast kind would have made (at tokens.size() ==
  // first) while the neural kind answered; each scored once the committed
  // text decides it.
  std::vector<std::pair<int64_t, std::vector<int32_t>>> shadows;
  std::vector<Branch> branches;
  std::map<std::pair<int64_t, int32_t>, Entry> cache;
};

struct DraftWorker::Path {
  Seq* seq = nullptr;
  model::BlockTable* table = nullptr;
  int64_t pos0 = 0;            // position of feed[0]
  std::vector<int32_t> feed;   // tokens fed at step 0
  int64_t steps = 0;           // tokens to sample after the feed (0: score only)
  int64_t rank_from = 0;       // score only: fed positions >= rank_from get ranked lists
  std::vector<int32_t> out;
  std::vector<float> q;        // [steps, vocab]
  std::vector<Ranked> ranked;      // per sampled token: its row's ranking
  std::vector<Ranked> fed_ranked;  // score only: per fed position >= rank_from
};

DraftWorker::DraftWorker(const EngineConfig& config, std::shared_ptr<model::Model> draft,
                         const TestingConfig& testing)
    : config_(config),
      testing_(testing),
      model_(std::move(draft)),
      vocab_(model_->config().vocab_size),
      planner_(config.k, config.fanout_list, config.fanout_budget, max_budget(config)),
      confidence_(config.fanout_list.empty() && config.fanout_mode == "confidence") {
  const int64_t bs = config_.kv_block_size;
  const int64_t per_branch = 1 + (config_.k + bs - 1) / bs;
  // Room for a full tree of every sequence: each branch copies its prefix's
  // partial block and grows by K positions.
  const int64_t tree_blocks = config_.max_batch * max_budget(config_) * per_branch;
  cache_ = std::make_unique<model::KvCache>(model_->config(),
                                            config_.num_kv_blocks() + config_.max_batch + tree_blocks, bs);
  pool_ = std::make_unique<kernels::ThreadPool>(config_.draft_threads);
  thread_ = std::thread([this] { loop(); });
}

DraftWorker::~DraftWorker() { stop(); }

void DraftWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  pool_.reset();
}

void DraftWorker::post(std::vector<SpecMessage> messages) {
  if (messages.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& m : messages) inbox_.push_back(std::move(m));
  wake_.notify_all();
}

void DraftWorker::collect(std::vector<Speculation>& out, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                  [this] { return !outbox_.empty() || stopping_; });
  for (auto& s : outbox_) out.push_back(std::move(s));
  outbox_.clear();
}

void DraftWorker::stats(DraftCounters& counters, DraftGauges& gauges) const {
  std::lock_guard<std::mutex> lock(mu_);
  counters = counters_;
  gauges = gauges_;
}

void DraftWorker::loop() {
  for (;;) {
    std::vector<SpecMessage> messages;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !inbox_.empty(); });
      if (stopping_) break;
      messages.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
      inbox_.clear();
    }
    std::vector<std::pair<RequestId, uint64_t>> asked;
    for (const auto& m : messages)
      if (m.kind != SpecMessage::Kind::kRelease) asked.emplace_back(m.id, m.epoch);
    try {
      handle(messages);
    } catch (const std::exception& e) {
      // Unexpected: end the sequences of this batch with the error instead of
      // leaving the target waiting for them.
      std::vector<Speculation> failed;
      for (const auto& [id, epoch] : asked) {
        Speculation r;
        r.id = id;
        r.epoch = epoch;
        r.error = std::string("draft worker failed: ") + e.what();
        failed.push_back(std::move(r));
        auto it = seqs_.find(id);
        if (it != seqs_.end()) {
          release(*it->second);
          seqs_.erase(it);
        }
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& r : failed) outbox_.push_back(std::move(r));
      ready_.notify_all();
    }
  }
  for (auto& [id, s] : seqs_) release(*s);
  seqs_.clear();
}

Speculation DraftWorker::answer(const Seq& s, SpecSource source, std::vector<float> q, bool one_hot) const {
  Speculation r;
  r.id = s.id;
  r.epoch = s.epoch;
  r.source = source;
  r.tokens = s.spec;
  r.q = std::move(q);
  r.one_hot = one_hot;
  return r;
}

void DraftWorker::handle(std::vector<SpecMessage>& messages) {
  std::vector<Speculation> out;
  std::vector<Seq*> misses, starts;
  int64_t outcomes = 0;
  for (auto& m : messages) {
    auto it = seqs_.find(m.id);
    if (m.kind == SpecMessage::Kind::kRelease) {
      if (it != seqs_.end() && it->second->epoch <= m.epoch) {
        release(*it->second);
        misses.erase(std::remove(misses.begin(), misses.end(), it->second.get()), misses.end());
        starts.erase(std::remove(starts.begin(), starts.end(), it->second.get()), starts.end());
        seqs_.erase(it);
      }
      continue;
    }
    if (m.kind == SpecMessage::Kind::kStart) {
      if (it != seqs_.end()) {
        release(*it->second);
        misses.erase(std::remove(misses.begin(), misses.end(), it->second.get()), misses.end());
        starts.erase(std::remove(starts.begin(), starts.end(), it->second.get()), starts.end());
        seqs_.erase(it);
      }
      auto s = std::make_unique<Seq>();
      s->id = m.id;
      s->epoch = m.epoch;
      s->params = m.params;
      s->seed = m.seed;
      s->tokens = std::move(m.tokens);
      starts.push_back(s.get());
      seqs_.emplace(m.id, std::move(s));
      continue;
    }
    if (it == seqs_.end() || it->second->epoch != m.epoch) continue;  // an older life
    if (m.verify_seconds > 0) last_verify_s_ = m.verify_seconds;
    ++outcomes;
    outcome(*it->second, m, misses, out);
  }
  const int64_t answered = static_cast<int64_t>(out.size() + misses.size() + starts.size());
  fanout_ = planner_.plan(std::max<int64_t>(answered, 1));

  std::vector<Seq*> failed;
  std::string failure;
  if (!misses.empty()) {
    const Fallback kind = choose_fallback(outcomes);
    if (kind == Fallback::kNeural)
      for (Seq* s : misses)
        s->shadows.emplace_back(static_cast<int64_t>(s->tokens.size()), ngram_propose(s->tokens, config_.k));
    try {
      run_fallback(misses, kind, out);
    } catch (const std::exception& e) {
      failure = std::string("draft fallback failed: ") + e.what();
      failed.insert(failed.end(), misses.begin(), misses.end());
    }
  }
  if (!starts.empty()) {
    try {
      run_fallback(starts, Fallback::kNeural, out, true);
      for (Seq* s : starts) s->source = SpecSource::kStart;
      for (auto& r : out)
        for (Seq* s : starts)
          if (r.id == s->id) r.source = SpecSource::kStart;
    } catch (const std::exception& e) {
      failure = std::string("draft prefill failed: ") + e.what();
      failed.insert(failed.end(), starts.begin(), starts.end());
    }
  }
  for (Seq* s : failed) {
    Speculation r;
    r.id = s->id;
    r.epoch = s->epoch;
    r.error = failure;
    out.push_back(std::move(r));
    release(*s);
    seqs_.erase(s->id);
  }
  std::vector<Seq*> to_tree;
  for (const auto& r : out) {
    if (!r.error.empty()) continue;
    auto it = seqs_.find(r.id);
    if (it != seqs_.end() && !it->second->treed) to_tree.push_back(it->second.get());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!confidence_) gauges_.fanout = fanout_;
    gauges_.fanout_budget = planner_.budget();
    gauges_.acceptance_estimate = planner_.acceptance();
    gauges_.miss_exponent = planner_.miss_exponent();
    gauges_.fallback_neural_estimate = kinds_[0].rounds > 0 ? kinds_[0].e : 0.0;
    gauges_.fallback_fast_estimate = kinds_[1].rounds > 0 ? kinds_[1].e : 0.0;
    for (auto& r : out) outbox_.push_back(std::move(r));
    ready_.notify_all();
  }
  if (testing_.always_miss || to_tree.empty()) return;
  try {
    build_trees(to_tree);
  } catch (const std::exception&) {
    // A tree that cannot be built only costs hits: its outcomes fall back.
    for (Seq* s : to_tree) free_tree(*s);
  }
}

void DraftWorker::outcome(Seq& s, const SpecMessage& m, std::vector<Seq*>& misses,
                          std::vector<Speculation>& out) {
  const int64_t K = config_.k;
  const auto L = static_cast<int64_t>(s.tokens.size());
  const int64_t k = std::clamp<int64_t>(m.accepted, 0, static_cast<int64_t>(s.spec.size()));
  // Where the bonus ranked among this fork point's candidates.
  if (k < static_cast<int64_t>(s.ranked.size()) && !s.ranked[k].empty()) {
    int64_t rank = 0, listed = 0;
    for (int32_t t : s.ranked[k].tokens) {
      if (k < K && k < static_cast<int64_t>(s.spec.size()) && t == s.spec[k]) continue;
      ++listed;
      if (t == m.bonus && rank == 0) rank = listed;
    }
    planner_.observe_outcome(k, m.proposed, rank, listed);
  } else {
    planner_.observe_outcome(k, m.proposed, 0, 0);
  }
  // Calibration of the confidence-ranked fan-out: greedy proposals verified
  // this round (the first k accepted, the next one rejected), by the draft's
  // probability of them.
  if (confidence_ && s.params.temperature == 0.0) {
    const int64_t last = std::min<int64_t>({k, K - 1, static_cast<int64_t>(s.spec.size()) - 1});
    for (int64_t i = 0; i <= last; ++i) {
      if (i >= static_cast<int64_t>(s.ranked.size()) || s.ranked[i].probs.empty()) break;
      planner_.observe_proposal(s.ranked[i].prob_of(s.spec[i]), i < k);
    }
  }
  // Fallback speed-model inputs: tokens per round by where the speculation came from.
  const double emitted = static_cast<double>(k + 1);
  int64_t hit_rounds = 1;
  if (s.source == SpecSource::kHit) ema(e_hit_, hit_rounds, emitted);
  if (s.source == SpecSource::kNeural) ema(kinds_[0].e, kinds_[0].rounds, emitted);
  if (s.source == SpecSource::kFast) ema(kinds_[1].e, kinds_[1].rounds, emitted);

  const auto key = std::make_pair(k, m.bonus);
  auto entry = s.cache.find(key);
  bool hit = !testing_.always_miss && s.treed && entry != s.cache.end();
  for (int64_t i = 0; i < k; ++i) s.tokens.push_back(s.spec[i]);
  s.tokens.push_back(m.bonus);
  score_shadow(s);
  s.computed = std::min(s.computed, L + k);
  cache_->truncate(s.table, s.computed);
  if (hit) {
    // The branch already holds the KV of the bonus and K - 1 drafted tokens.
    const int64_t P = L + k;
    const auto& branch = s.branches[entry->second.branch];
    if (cache_->reserve(s.table, P + K)) {
      copy_slots(branch.table, s.table, P, P + K);
      s.computed = P + K;
      s.spec = std::move(entry->second.tokens);
      s.ranked = std::move(entry->second.ranked);
      s.ranked.resize(static_cast<size_t>(K + 1));
      s.source = SpecSource::kHit;
      out.push_back(answer(s, SpecSource::kHit, std::move(entry->second.q), false));
    } else {
      hit = false;
    }
  }
  hit_rate_ = 0.95 * hit_rate_ + 0.05 * (hit ? 1.0 : 0.0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.kv_commits += hit ? 1 : 0;
  }
  free_tree(s);
  if (!hit) {
    s.spec.clear();
    s.ranked.clear();
    misses.push_back(&s);
  }
}

void DraftWorker::score_shadow(Seq& s) {
  // Verifying a one-hot proposal accepts its next token with the target's
  // probability of that token, the probability that the target's own sample
  // there is that token. So the tokens a round verifying the n-gram proposal
  // would have emitted (agreeing prefix + 1) follow the same law when read
  // off the committed text: at any temperature, without running it.
  int64_t rounds = 0, tokens = 0;
  for (auto it = s.shadows.begin(); it != s.shadows.end();) {
    const int64_t emitted = proposal_emitted(s.tokens, it->first, it->second);
    if (emitted < 0) {  // the text agrees so far
      ++it;
      continue;
    }
    ema(kinds_[1].e, kinds_[1].rounds, static_cast<double>(emitted));
    ++rounds;
    tokens += emitted;
    it = s.shadows.erase(it);
  }
  if (rounds == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  counters_.fast_shadow_rounds += rounds;
  counters_.fast_shadow_tokens += tokens;
}

DraftWorker::Fallback DraftWorker::choose_fallback(int64_t batch) {
  const Fallback chosen = pick_fallback(batch);
  if (chosen != in_force_)
    SSD_LOG_INFO("ssd fallback: " << (chosen == Fallback::kFast ? "fast (n-gram)" : "neural") << " from now on (batch "
                                  << batch << ", hit rate " << hit_rate_ << ")");
  return in_force_ = chosen;
}

DraftWorker::Fallback DraftWorker::pick_fallback(int64_t batch) const {
  if (config_.fallback == "neural") return Fallback::kNeural;
  if (config_.fallback == "fast") return Fallback::kFast;
  // "auto": the speed model for each kind; with a batch, one miss anywhere
  // delays the whole round. The fast kind costs nothing to try, so it runs
  // first until its tokens per round are known. The neural kind drafts with
  // the same model and sampling as the tree, so until it has run, its tokens
  // per round are taken to be the hits' and its time K draft steps.
  constexpr int64_t kWarmup = 4;
  const KindStats& fast = kinds_[1];
  if (fast.rounds < kWarmup) return Fallback::kFast;
  KindStats neural = kinds_[0];
  const int64_t b = std::max<int64_t>(batch, 1);
  if (neural.rounds == 0) neural.e = e_hit_;
  if (neural.runs == 0 && last_verify_s_ > 0)
    neural.tb = static_cast<double>(config_.k) * planner_.step_seconds(static_cast<double>(b)) / last_verify_s_;
  auto speed = [&](const KindStats& k) {
    RoundModel m;
    m.p_hit = hit_rate_;
    m.e_hit = e_hit_;
    m.e_miss = k.e;
    m.t_p = tp_;
    m.t_b = k.tb;
    m.batch = b;
    return predict_round(m).speedup;
  };
  return speed(fast) >= speed(neural) ? Fallback::kFast : Fallback::kNeural;
}

void DraftWorker::run_fallback(std::vector<Seq*>& seqs, Fallback kind, std::vector<Speculation>& out,
                               bool starts) {
  const auto t0 = WorkerClock::now();
  const int64_t K = config_.k;
  if (kind == Fallback::kFast) {
    for (Seq* s : seqs) {
      s->spec = ngram_propose(s->tokens, K);
      s->ranked.assign(static_cast<size_t>(K + 1), {});
      s->source = SpecSource::kFast;
      out.push_back(answer(*s, SpecSource::kFast, {}, true));
    }
  } else {
    std::vector<Path> paths(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq* s = seqs[i];
      const auto L = static_cast<int64_t>(s->tokens.size());
      Path& p = paths[i];
      p.seq = s;
      p.table = &s->table;
      p.pos0 = s->computed;
      p.feed.assign(s->tokens.begin() + s->computed, s->tokens.end());
      p.steps = K;
      if (p.feed.empty()) throw std::logic_error("draft state ahead of its sequence");
      (void)L;
    }
    decode_paths(paths, fanout_);
    for (Path& p : paths) {
      Seq* s = p.seq;
      s->computed = static_cast<int64_t>(s->tokens.size()) - 1 + K;
      s->spec = std::move(p.out);
      s->ranked = std::move(p.ranked);
      s->ranked.resize(static_cast<size_t>(K + 1));
      s->source = SpecSource::kNeural;
      out.push_back(answer(*s, SpecSource::kNeural, std::move(p.q), false));
    }
  }
  const double seconds = since(t0);
  if (starts) return;  // a first draft (with the draft's prefill) is no fallback
  if (last_verify_s_ > 0) {
    KindStats& k = kinds_[kind == Fallback::kFast ? 1 : 0];
    const double tb = seconds / last_verify_s_;
    k.tb = k.runs++ == 0 ? tb : 0.8 * k.tb + 0.2 * tb;
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.fallback_seconds += seconds;
  counters_.fallback_batches += 1;
}

void DraftWorker::build_trees(std::vector<Seq*>& seqs) {
  const auto t0 = WorkerClock::now();
  const int64_t K = config_.k;
  const int64_t bs = cache_->block_size();
  // 1. The draft distributions at the fork points not known yet (at least
  //    position K, after the last proposal).
  // Without branches at K (F_K = 0) the last proposal need not be fed yet.
  const int64_t fork_end = fanout_[K] > 0 || confidence_ ? K : K - 1;
  std::vector<Path> score;
  for (Seq* s : seqs) {
    const auto L = static_cast<int64_t>(s->tokens.size());
    if (s->computed >= L + fork_end) continue;
    Path p;
    p.seq = s;
    p.table = &s->table;
    p.pos0 = s->computed;
    for (int64_t pos = s->computed; pos < L + fork_end; ++pos)
      p.feed.push_back(pos < L ? s->tokens[pos] : s->spec[pos - L]);
    p.rank_from = L - 1;
    score.push_back(std::move(p));
  }
  decode_paths(score, fanout_, true);
  for (Path& p : score) {
    Seq* s = p.seq;
    const auto L = static_cast<int64_t>(s->tokens.size());
    const int64_t first = std::max(p.pos0, p.rank_from);
    for (size_t r = 0; r < p.fed_ranked.size(); ++r) {
      const int64_t j = first + static_cast<int64_t>(r) - (L - 1);
      if (j >= 0 && j <= K && s->ranked[j].empty()) s->ranked[j] = std::move(p.fed_ranked[r]);
    }
    s->computed = L + fork_end;
  }
  const double fork_s = since(t0);

  // 2. Candidates: top-F_j at fork point j, skipping the drafted token there;
  //    for greedy sequences under the confidence policy, the budget's most
  //    likely outcomes over all fork points instead.
  std::vector<int64_t> realized(static_cast<size_t>(K + 1), 0);  // branches per fork point
  for (Seq* s : seqs) {
    const auto L = static_cast<int64_t>(s->tokens.size());
    std::vector<std::pair<int64_t, int32_t>> picks;  // (j, candidate)
    // Until enough greedy proposals calibrate it, the geometric plan.
    if (confidence_ && s->params.temperature == 0.0 && planner_.proposals_observed() >= FanoutPlanner::kCalibrated) {
      std::vector<ForkPoint> forks(static_cast<size_t>(K + 1));
      std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(K + 1));
      for (int64_t j = 0; j <= K; ++j) {
        const Ranked& r = s->ranked[j];
        for (size_t i = 0; i < r.tokens.size() && i < r.probs.size(); ++i) {
          if (j < K && r.tokens[i] == s->spec[j]) {
            forks[j].proposed_prob = r.probs[i];
            continue;
          }
          forks[j].candidates.push_back(r.probs[i]);
          tokens[j].push_back(r.tokens[i]);
        }
      }
      const auto chosen = confidence_branches(forks, planner_.budget(),
                                              [this](double p) { return planner_.proposal_acceptance(p); });
      for (const auto& [j, c] : chosen) picks.emplace_back(j, tokens[j][c]);
    } else {
      for (int64_t j = 0; j <= K; ++j) {
        int64_t taken = 0;
        for (int32_t c : s->ranked[j].tokens) {
          if (taken >= fanout_[j]) break;
          if (j < K && c == s->spec[j]) continue;
          ++taken;
          picks.emplace_back(j, c);
        }
      }
    }
    for (const auto& [j, c] : picks) {
      const int64_t P = L + j;
      Seq::Branch b;
      b.j = j;
      b.c = c;
      b.shared = P / bs;
      b.table.blocks.assign(s->table.blocks.begin(), s->table.blocks.begin() + b.shared);
      if (!cache_->reserve(b.table, P + K)) {
        cache_->truncate(b.table, b.shared * bs);
        goto planned;  // out of tree blocks: the tree stays partial
      }
      if (P % bs != 0) copy_slots(s->table, b.table, b.shared * bs, P);
      s->branches.push_back(std::move(b));
      realized[j] += 1;
    }
  }
planned:
  std::vector<Path> paths;
  for (Seq* s : seqs)
    for (auto& b : s->branches) {
      Path p;
      p.seq = s;
      p.table = &b.table;
      p.pos0 = static_cast<int64_t>(s->tokens.size()) + b.j;
      p.feed = {b.c};
      p.steps = K;
      paths.push_back(std::move(p));
    }
  const auto t1 = WorkerClock::now();
  if (!paths.empty()) decode_paths(paths, fanout_, true, true);
  const double tree_s = since(t1);
  size_t next = 0;
  for (Seq* s : seqs) {
    for (size_t bi = 0; bi < s->branches.size(); ++bi, ++next) {
      Path& p = paths[next];
      Seq::Entry e;
      e.tokens = std::move(p.out);
      e.q = std::move(p.q);
      e.ranked = std::move(p.ranked);
      e.branch = bi;
      s->cache.emplace(std::make_pair(s->branches[bi].j, s->branches[bi].c), std::move(e));
    }
    s->treed = true;
  }
  const double round_s = since(t0);
  planner_.observe_round(fork_s, tree_s, last_verify_s_ > 0 ? last_verify_s_ : round_s);
  if (last_verify_s_ > 0) tp_ = 0.8 * tp_ + 0.2 * round_s / last_verify_s_;
  std::lock_guard<std::mutex> lock(mu_);
  if (confidence_) gauges_.fanout = realized;
  counters_.draft_rounds += 1;
  counters_.tree_branches += static_cast<int64_t>(paths.size());
  counters_.draft_round_seconds += round_s;
}

void DraftWorker::decode_paths(std::vector<Path>& paths, const std::vector<int64_t>& fanout, bool tree,
                               bool branches) {
  if (paths.empty()) return;
  // Ranked lists long enough for every candidate a branch may take, plus the proposal.
  int64_t m = std::max<int64_t>(2, *std::max_element(fanout.begin(), fanout.end()) + 1);
  // Probabilities only where a greedy sequence's confidence-ranked tree reads them.
  const bool probs = confidence_ && std::any_of(paths.begin(), paths.end(), [](const Path& p) {
                       return p.seq->params.temperature == 0.0;
                     });
  if (probs) m = std::max(m, std::min<int64_t>(planner_.budget(), kMaxConfidenceRank) + 1);
  int64_t forwards = 1;
  for (const Path& p : paths) forwards = std::max(forwards, p.steps);
  for (Path& p : paths) {
    p.out.clear();
    p.q.assign(static_cast<size_t>(p.steps * vocab_), 0.0f);
    p.ranked.assign(static_cast<size_t>(p.steps), {});
    p.fed_ranked.clear();
  }
  for (int64_t step = 0; step < forwards; ++step) {
    const auto t0 = WorkerClock::now();
    model::ForwardInput in;
    std::vector<Path*> active;
    std::vector<int64_t> first_row;  // per active path: its first logit row
    for (Path& p : paths) {
      if (step > 0 && step >= p.steps) continue;
      const auto fed = static_cast<int64_t>(p.feed.size());
      const int64_t begin = step == 0 ? p.pos0 : p.pos0 + fed + step - 1;
      const int64_t count = step == 0 ? fed : 1;
      if (!cache_->reserve(*p.table, begin + count)) throw std::runtime_error("draft KV cache is full");
      first_row.push_back(static_cast<int64_t>(in.logit_rows.size()));
      for (int64_t i = 0; i < count; ++i) {
        const int64_t pos = begin + i;
        in.tokens.push_back(step == 0 ? p.feed[i] : p.out[step - 1]);
        in.positions.push_back(static_cast<int32_t>(pos));
        in.seq_of_token.push_back(static_cast<int32_t>(active.size()));
        const bool wanted = p.steps > 0 ? i == count - 1 : pos >= p.rank_from;
        if (wanted) in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
      }
      active.push_back(&p);
    }
    for (const Path* p : active)
      in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(p->table->blocks.size()));
    in.block_tables.assign(active.size() * static_cast<size_t>(in.max_blocks), 0);
    for (size_t s = 0; s < active.size(); ++s)
      std::copy(active[s]->table->blocks.begin(), active[s]->table->blocks.end(),
                in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
    // The tree (fork scoring and branch steps) always takes the pair kernels
    // when they are on; other forwards from draft_matmul_min_rows rows.
    const int64_t min_rows = config_.draft_matmul_min_rows;
    in.matmul_min_rows = tree && min_rows > 0 ? 1 : min_rows;
    if (in.logit_rows.empty()) {
      // Nothing wanted (a score path whose fork points are all known): still write the KV.
      in.logit_rows.push_back(0);
    }
    const at::Tensor logits = model_->forward(in, *cache_, *pool_);
    const float* rows = logits.data_ptr<float>();
    // Score-only paths keep rankings; sampling paths draw their next token.
    std::vector<Path*> sampling;
    std::vector<const float*> sample_rows;
    for (size_t a = 0; a < active.size(); ++a) {
      Path* p = active[a];
      const int64_t r0 = first_row[a];
      const int64_t r1 = a + 1 < active.size() ? first_row[a + 1] : static_cast<int64_t>(in.logit_rows.size());
      if (p->steps == 0) {
        for (int64_t r = r0; r < r1; ++r) p->fed_ranked.push_back(Ranked::of(rows + r * vocab_, vocab_, m, probs));
        continue;
      }
      sampling.push_back(p);
      sample_rows.push_back(rows + r0 * vocab_);
    }
    if (!sampling.empty()) {
      const auto n = static_cast<int64_t>(sampling.size());
      std::vector<float> z(static_cast<size_t>(n * vocab_));
      DraftRows draw(vocab_);
      const int64_t f = step < static_cast<int64_t>(fanout.size()) ? fanout[step] : 0;
      for (int64_t r = 0; r < n; ++r) {
        const Path* p = sampling[r];
        std::copy(sample_rows[r], sample_rows[r] + vocab_, z.begin() + r * vocab_);
        draw.add(p->seq->params, p->seq->seed, p->pos0 + static_cast<int64_t>(p->feed.size()) + step, f,
                 config_.saguaro_c);
      }
      draw.sample(z.data());
      for (int64_t r = 0; r < n; ++r) {
        Path* p = sampling[r];
        p->out.push_back(static_cast<int32_t>(draw.tokens[r]));
        std::copy(draw.probs.begin() + r * vocab_, draw.probs.begin() + (r + 1) * vocab_,
                  p->q.begin() + step * vocab_);
        p->ranked[step] = Ranked::of(z.data() + r * vocab_, vocab_, m, probs);
      }
      if (branches) planner_.observe_tree_step(n, since(t0));
    }
  }
}

void DraftWorker::copy_slots(const model::BlockTable& from, const model::BlockTable& to, int64_t begin,
                             int64_t end) {
  if (end <= begin) return;
  const int64_t bs = cache_->block_size();
  std::vector<int64_t> src, dst;
  for (int64_t pos = begin; pos < end; ++pos) {
    src.push_back(static_cast<int64_t>(from.blocks[pos / bs]) * bs + pos % bs);
    dst.push_back(static_cast<int64_t>(to.blocks[pos / bs]) * bs + pos % bs);
  }
  const at::Tensor& storage = cache_->storage();  // [layers, 2, blocks, bs, heads, dim]
  const int64_t row = storage.size(4) * storage.size(5);
  const int64_t slots = storage.size(2) * bs;
  kernels::KvRows rows;
  rows.slot_stride = row * static_cast<int64_t>(sizeof(float));
  rows.kind_stride = slots * rows.slot_stride;
  rows.layer_stride = 2 * rows.kind_stride;
  rows.num_slots = slots;
  kernels::KvCommitParams p;
  p.cache = storage.data_ptr();
  p.cache_rows = rows;
  p.tree = storage.data_ptr();
  p.tree_rows = rows;
  p.num_layers = storage.size(0);
  p.row_bytes = rows.slot_stride;
  p.src_slots = src.data();
  p.dst_slots = dst.data();
  p.n = static_cast<int64_t>(src.size());
  p.tree_in_cache = true;
  p.tree_slot_offset = 0;
  const kernels::KvCommitStatus status = kernels::kv_commit(p);
  if (status.error != kernels::KvCommitError::kNone)
    throw std::logic_error("draft KV copy: " + kernels::describe(status));
}

void DraftWorker::free_tree(Seq& s) {
  for (auto& b : s.branches) cache_->truncate(b.table, b.shared * cache_->block_size());
  s.branches.clear();
  s.cache.clear();
  s.treed = false;
}

void DraftWorker::release(Seq& s) {
  free_tree(s);
  cache_->truncate(s.table, 0);
  s.computed = 0;
}

}  // namespace ssd::runtime
