#include "path_decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "../kernels/cpu/fork_select.h"
#include "../kernels/cpu/gumbel.h"
#include "../kernels/cpu/ops.h"
#include "coupling.h"
#include "draft_sampling.h"
#include "speculation_cache.h"

#include <ATen/core/Tensor.h>

namespace ssd::runtime {

namespace {

// How deep a fork point's list goes for the confidence-ranked fan-out: its
// branches may take any of the budget's best outcomes, capped here.
constexpr int64_t kMaxConfidenceRank = 32;

}  // namespace

bool confidence_fanout(const EngineConfig& config) {
  return config.fanout_list.empty() && config.fanout_mode == "confidence";
}

double RankedTokens::prob_of(int32_t token) const {
  for (size_t i = 0; i < tokens.size() && i < probs.size(); ++i)
    if (tokens[i] == token) return probs[i];
  return 0.0;
}

RankedTokens RankedTokens::of(const float* logits, int64_t vocab, int64_t depth, bool with_probs) {
  // The fork_select kernel ranks any row by (value desc, id asc); one
  // position with nothing drafted there is a plain top-`depth` of the row.
  std::vector<int64_t> best(static_cast<size_t>(depth));
  const int64_t count = kernels::top_of_row(logits, vocab, depth, best.data());
  RankedTokens r;
  r.tokens.assign(best.begin(), best.begin() + count);
  if (with_probs && !r.tokens.empty()) {
    const float top = logits[r.tokens[0]];
    const double total = kernels::sum_exp(logits, vocab, top);
    for (int32_t t : r.tokens) r.probs.push_back(static_cast<float>(std::exp(logits[t] - top) / total));
  }
  return r;
}

RankedTokens RankedTokens::perturbed(const float* q, int64_t vocab, uint64_t seed, int64_t position, int64_t depth,
                                     bool with_probs) {
  std::vector<int32_t> ids(static_cast<size_t>(depth));
  std::vector<double> scores(static_cast<size_t>(depth));
  const int64_t count = kernels::gumbel_top(q, vocab, kernels::gumbel_row_key(seed, static_cast<uint64_t>(position)),
                                            depth, ids.data(), scores.data());
  RankedTokens r;
  r.tokens.assign(ids.begin(), ids.begin() + count);
  if (with_probs) {
    double total = 0.0;
    for (int64_t i = 0; i < count; ++i) total += scores[i];
    for (int64_t i = 0; i < count; ++i) r.probs.push_back(static_cast<float>(scores[i] / total));
  }
  return r;
}

DraftPath DraftPath::sampling(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                              int64_t steps) {
  DraftPath p;
  p.seq = &seq;
  p.table = &table;
  p.pos0 = pos0;
  p.feed = std::move(feed);
  p.steps = steps;
  return p;
}

DraftPath DraftPath::scoring(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                             int64_t rank_from) {
  DraftPath p = sampling(seq, table, pos0, std::move(feed), 0);
  p.rank_from = rank_from;
  return p;
}

/// One forward's input and, per path in it, its first logit row.
struct PathDecoder::StepBatch {
  model::ForwardInput in;
  std::vector<DraftPath*> active;
  std::vector<int64_t> first_row;
};

PathDecoder::PathDecoder(const EngineConfig& config, const model::Model& model, model::KvCache& kv,
                         kernels::ThreadPool& pool, FanoutPlanner& planner)
    : config_(config),
      model_(model),
      kv_(kv),
      pool_(pool),
      planner_(planner),
      vocab_(model.config().vocab_size),
      confidence_(confidence_fanout(config)),
      gumbel_(gumbel_coupling(config)) {}

PathDecoder::Ranking PathDecoder::ranking_for(const std::vector<DraftPath>& paths,
                                              const std::vector<int64_t>& fanout) const {
  // Long enough for every candidate a branch may take, plus the proposal.
  Ranking r;
  r.depth = std::max<int64_t>(2, *std::max_element(fanout.begin(), fanout.end()) + 1);
  // Probabilities only where a confidence-ranked tree reads them: greedy
  // sequences', and every sequence's under the Gumbel coupling.
  r.probs = confidence_ && (gumbel_ || std::any_of(paths.begin(), paths.end(), [](const DraftPath& p) {
              return p.seq->params.temperature == 0.0;
            }));
  if (r.probs) r.depth = std::max(r.depth, std::min<int64_t>(planner_.budget(), kMaxConfidenceRank) + 1);
  return r;
}

void PathDecoder::decode(std::vector<DraftPath>& paths, const std::vector<int64_t>& fanout, DraftForwards purpose) {
  if (paths.empty()) return;
  const Ranking ranking = ranking_for(paths, fanout);
  int64_t forwards = 1;
  for (const DraftPath& p : paths) forwards = std::max(forwards, p.steps);
  for (DraftPath& p : paths) {
    p.out.clear();
    p.q.assign(static_cast<size_t>(p.steps * vocab_), 0.0f);
    p.ranked.assign(static_cast<size_t>(p.steps), {});
    p.fed_ranked.clear();
  }
  for (int64_t step = 0; step < forwards; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepBatch batch = gather(paths, step, purpose);
    const at::Tensor logits = model_.forward(batch.in, kv_, pool_);
    host_bytes_ += static_cast<int64_t>(logits.nbytes());
    const int64_t sampled = take_rows(batch, logits.data_ptr<float>(), step, fanout, ranking);
    if (purpose == DraftForwards::kBranches && sampled > 0)
      planner_.observe_tree_step(sampled, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

PathDecoder::StepBatch PathDecoder::gather(std::vector<DraftPath>& paths, int64_t step, DraftForwards purpose) {
  StepBatch b;
  model::ForwardInput& in = b.in;
  for (DraftPath& p : paths) {
    if (step > 0 && step >= p.steps) continue;
    const auto fed = static_cast<int64_t>(p.feed.size());
    const int64_t begin = step == 0 ? p.pos0 : p.pos0 + fed + step - 1;
    const int64_t count = step == 0 ? fed : 1;
    if (!kv_.reserve(*p.table, begin + count)) throw std::runtime_error("draft KV cache is full");
    b.first_row.push_back(static_cast<int64_t>(in.logit_rows.size()));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = begin + i;
      in.tokens.push_back(step == 0 ? p.feed[i] : p.out[step - 1]);
      in.positions.push_back(static_cast<int32_t>(pos));
      in.seq_of_token.push_back(static_cast<int32_t>(b.active.size()));
      const bool wanted = p.steps > 0 ? i == count - 1 : pos >= p.rank_from;
      if (wanted) in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
    }
    b.active.push_back(&p);
  }
  for (const DraftPath* p : b.active)
    in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(p->table->blocks.size()));
  in.block_tables.assign(b.active.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
  for (size_t s = 0; s < b.active.size(); ++s)
    std::copy(b.active[s]->table->blocks.begin(), b.active[s]->table->blocks.end(),
              in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
  // The tree (fork scoring and branch steps) always takes the pair kernels
  // when they are on; other forwards from draft_matmul_min_rows rows.
  const int64_t min_rows = config_.draft_matmul_min_rows;
  in.matmul_min_rows = purpose != DraftForwards::kFallback && min_rows > 0 ? 1 : min_rows;
  // A score path whose fork points are all known wants no row, but its KV must still be written.
  if (in.logit_rows.empty()) in.logit_rows.push_back(0);
  return b;
}

RankedTokens PathDecoder::rank_row(const DraftSequence& s, const float* logits, const float* q, int64_t position,
                                   const Ranking& ranking) {
  if (!gumbel_ || s.params.temperature == 0.0) return RankedTokens::of(logits, vocab_, ranking.depth, ranking.probs);
  if (q == nullptr) {
    const SamplingParams& sp = s.params;
    q_.resize(static_cast<size_t>(vocab_));
    kernels::process_logits(logits, vocab_, {sp.temperature, sp.top_k, sp.top_p}, q_.data(), scratch_);
    q = q_.data();
  }
  return RankedTokens::perturbed(q, vocab_, s.seed, position, ranking.depth, ranking.probs);
}

int64_t PathDecoder::take_rows(const StepBatch& batch, const float* rows, int64_t step,
                               const std::vector<int64_t>& fanout, const Ranking& ranking) {
  std::vector<DraftPath*> sampling;
  std::vector<const float*> sample_rows;
  for (size_t a = 0; a < batch.active.size(); ++a) {
    DraftPath* p = batch.active[a];
    const int64_t r0 = batch.first_row[a];
    const int64_t r1 = a + 1 < batch.active.size() ? batch.first_row[a + 1]
                                                   : static_cast<int64_t>(batch.in.logit_rows.size());
    if (p->steps == 0) {
      // Row r scores the token after fed position first + (r - r0).
      const int64_t first = std::max(p->pos0, p->rank_from);
      for (int64_t r = r0; r < r1; ++r)
        p->fed_ranked.push_back(rank_row(*p->seq, rows + r * vocab_, nullptr, first + (r - r0) + 1, ranking));
      continue;
    }
    sampling.push_back(p);
    sample_rows.push_back(rows + r0 * vocab_);
  }
  const auto n = static_cast<int64_t>(sampling.size());
  if (n == 0) return 0;
  // SAGUARO sampling: sampled token `step` is the next speculation's proposal
  // at fork point `step`, whose F top tokens it downweights.
  std::vector<float> z(static_cast<size_t>(n * vocab_));
  DraftRows draw(vocab_, gumbel_);
  const int64_t f = step < static_cast<int64_t>(fanout.size()) ? fanout[step] : 0;
  for (int64_t r = 0; r < n; ++r) {
    const DraftPath* p = sampling[r];
    std::copy(sample_rows[r], sample_rows[r] + vocab_, z.begin() + r * vocab_);
    draw.add(p->seq->params, p->seq->seed, p->pos0 + static_cast<int64_t>(p->feed.size()) + step, f,
             config_.saguaro_c);
  }
  draw.sample(z.data());
  for (int64_t r = 0; r < n; ++r) {
    DraftPath* p = sampling[r];
    p->out.push_back(static_cast<int32_t>(draw.tokens[r]));
    std::copy(draw.probs.begin() + r * vocab_, draw.probs.begin() + (r + 1) * vocab_, p->q.begin() + step * vocab_);
    // Ranked by the draft's own distribution q: with C < 1 the row sampled
    // from (sigma) pushes down exactly the likeliest target draws.
    const float* q = config_.saguaro_c < 1.0 ? nullptr : draw.probs.data() + r * vocab_;
    p->ranked[step] = rank_row(*p->seq, z.data() + r * vocab_, q, draw.positions[r], ranking);
  }
  return n;
}

}  // namespace ssd::runtime
