#include "path_decoder.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "coupling.h"
#include "draft_sampling.h"
#include "speculation_cache.h"

#include <ATen/ATen.h>

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

RankedTokens RankedTokens::top(const int64_t* ids, const float* probs, int64_t depth) {
  RankedTokens r;
  for (int64_t i = 0; i < depth && ids[i] >= 0; ++i) {
    r.tokens.push_back(static_cast<int32_t>(ids[i]));
    if (probs != nullptr) r.probs.push_back(probs[i]);
  }
  return r;
}

RankedTokens RankedTokens::perturbed(const int64_t* ids, const double* scores, int64_t depth, bool with_probs) {
  RankedTokens r;
  double total = 0.0;
  int64_t count = 0;
  for (; count < depth && ids[count] >= 0; ++count) {
    r.tokens.push_back(static_cast<int32_t>(ids[count]));
    total += scores[count];
  }
  if (with_probs)
    for (int64_t i = 0; i < count; ++i) r.probs.push_back(static_cast<float>(scores[i] / total));
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

DraftPath DraftPath::branch(DraftSequence& seq, const model::BlockTable& prefix, model::BlockTable& table,
                            int64_t pos0, std::vector<int32_t> feed, int64_t steps) {
  DraftPath p = sampling(seq, table, pos0, std::move(feed), steps);
  p.prefix = &prefix;
  return p;
}

DraftPath DraftPath::scoring(DraftSequence& seq, model::BlockTable& table, int64_t pos0, std::vector<int32_t> feed,
                             int64_t rank_from) {
  DraftPath p = sampling(seq, table, pos0, std::move(feed), 0);
  p.rank_from = rank_from;
  return p;
}

/// One forward's input and, per path in it, its index in the decode's paths
/// and its first logit row.
struct PathDecoder::StepBatch {
  model::ForwardInput in;
  std::vector<DraftPath*> active;
  std::vector<int64_t> path_index;
  std::vector<int64_t> first_row;
};

/// The rows of one step that want a ranked list, by how they are ranked:
/// plain (a logits row by value), processed (a logits row processed with its
/// sequence's settings, then Gumbel-ranked) or drawn (a row sampled from, q,
/// Gumbel-ranked); each with the list it fills.
struct PathDecoder::RankJobs {
  std::vector<int64_t> plain_rows;
  std::vector<RankedTokens*> plain_out;
  std::vector<int64_t> processed_rows;
  std::vector<RankedTokens*> processed_out;
  std::vector<double> temperature, top_p;
  std::vector<int64_t> top_k, processed_seeds, processed_positions;
  std::vector<int64_t> drawn_rows;
  std::vector<RankedTokens*> drawn_out;
  std::vector<int64_t> drawn_seeds, drawn_positions;

  /// The list of a row that draws the token at `position` of `s` (from its
  /// logits row `row`, or from q's row `drawn` when >= 0).
  void add(const DraftSequence& s, bool gumbel, int64_t row, int64_t drawn, int64_t position, RankedTokens* out) {
    if (!gumbel || s.params.temperature == 0.0) {
      plain_rows.push_back(row);
      plain_out.push_back(out);
    } else if (drawn >= 0) {
      drawn_rows.push_back(drawn);
      drawn_out.push_back(out);
      drawn_seeds.push_back(static_cast<int64_t>(s.seed));
      drawn_positions.push_back(position);
    } else {
      processed_rows.push_back(row);
      processed_out.push_back(out);
      temperature.push_back(s.params.temperature);
      top_k.push_back(s.params.top_k);
      top_p.push_back(s.params.top_p);
      processed_seeds.push_back(static_cast<int64_t>(s.seed));
      processed_positions.push_back(position);
    }
  }
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
  const model::Backend& be = model_.backend();
  // The draft's stream (and device) for the forwards, the draws and the rankings.
  const auto scope = be.forward_scope();
  int64_t steps = 0;
  for (const DraftPath& p : paths) steps = std::max(steps, p.steps);
  const int64_t forwards = std::max<int64_t>(1, steps);  // a scoring-only decode still runs one forward
  // Every path's sampled rows in one buffer on the device, [paths, steps, vocab].
  const at::Tensor q_all =
      at::empty({static_cast<int64_t>(paths.size()), steps, vocab_}, at::TensorOptions().dtype(at::kFloat).device(be.device()));
  for (size_t i = 0; i < paths.size(); ++i) {
    DraftPath& p = paths[i];
    p.out.clear();
    p.q = p.steps > 0 ? q_all[static_cast<int64_t>(i)].narrow(0, 0, p.steps) : at::Tensor();
    p.ranked.assign(static_cast<size_t>(p.steps), {});
    p.fed_ranked.clear();
  }
  for (int64_t step = 0; step < forwards; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const StepBatch batch = gather(paths, step, purpose);
    const at::Tensor logits = model_.forward_device(batch.in, kv_, pool_);
    const int64_t sampled = take_rows(batch, logits, step, fanout, ranking, q_all);
    if (purpose == DraftForwards::kBranches && sampled > 0)
      planner_.observe_tree_step(sampled, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

PathDecoder::StepBatch PathDecoder::gather(std::vector<DraftPath>& paths, int64_t step, DraftForwards purpose) {
  StepBatch b;
  model::ForwardInput& in = b.in;
  // The tables branches fork from (one per sequence), and each token's index
  // among them (-1: its path forks from nothing).
  std::vector<const model::BlockTable*> prefixes;
  std::vector<int32_t> prefix_of_token;
  for (DraftPath& p : paths) {
    if (step > 0 && step >= p.steps) continue;
    const auto fed = static_cast<int64_t>(p.feed.size());
    const int64_t begin = step == 0 ? p.pos0 : p.pos0 + fed + step - 1;
    const int64_t count = step == 0 ? fed : 1;
    if (!kv_.reserve(*p.table, begin + count)) throw std::runtime_error("draft KV cache is full");
    int32_t prefix = -1;
    if (p.prefix != nullptr) {
      prefix = static_cast<int32_t>(std::find(prefixes.begin(), prefixes.end(), p.prefix) - prefixes.begin());
      if (prefix == static_cast<int32_t>(prefixes.size())) prefixes.push_back(p.prefix);
    }
    b.first_row.push_back(static_cast<int64_t>(in.logit_rows.size()));
    b.path_index.push_back(&p - paths.data());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = begin + i;
      in.tokens.push_back(step == 0 ? p.feed[i] : p.out[step - 1]);
      in.positions.push_back(static_cast<int32_t>(pos));
      in.seq_of_token.push_back(static_cast<int32_t>(b.active.size()));
      in.prefix_len.push_back(prefix >= 0 ? static_cast<int32_t>(p.pos0) : 0);
      prefix_of_token.push_back(prefix);
      const bool wanted = p.steps > 0 ? i == count - 1 : pos >= p.rank_from;
      if (wanted) in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
    }
    b.active.push_back(&p);
  }
  // Block-table rows: each active path's table, then the ones forked from.
  std::vector<const model::BlockTable*> tables;
  for (const DraftPath* p : b.active) tables.push_back(p->table);
  tables.insert(tables.end(), prefixes.begin(), prefixes.end());
  if (prefixes.empty()) {
    in.prefix_len.clear();  // no forks: paged attention
  } else {
    for (size_t t = 0; t < prefix_of_token.size(); ++t)
      in.prefix_seq.push_back(prefix_of_token[t] >= 0 ? static_cast<int32_t>(b.active.size()) + prefix_of_token[t]
                                                      : in.seq_of_token[t]);
  }
  for (const model::BlockTable* t : tables)
    in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(t->blocks.size()));
  in.block_tables.assign(tables.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
  for (size_t s = 0; s < tables.size(); ++s)
    std::copy(tables[s]->blocks.begin(), tables[s]->blocks.end(),
              in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
  // The tree (fork scoring and branch steps) always takes the pair kernels
  // when they are on; other forwards from draft_matmul_min_rows rows.
  const int64_t min_rows = config_.draft_matmul_min_rows;
  in.matmul_min_rows = purpose != DraftForwards::kFallback && min_rows > 0 ? 1 : min_rows;
  // A score path whose fork points are all known wants no row, but its KV must still be written.
  if (in.logit_rows.empty()) in.logit_rows.push_back(0);
  return b;
}

int64_t PathDecoder::take_rows(const StepBatch& batch, const at::Tensor& logits, int64_t step,
                               const std::vector<int64_t>& fanout, const Ranking& ranking, const at::Tensor& q_all) {
  const model::Backend& be = model_.backend();
  RankJobs jobs;
  std::vector<size_t> sampling;      // indices into batch.active
  std::vector<int64_t> sample_rows;  // their logit rows
  for (size_t a = 0; a < batch.active.size(); ++a) {
    DraftPath* p = batch.active[a];
    const int64_t r0 = batch.first_row[a];
    const int64_t r1 = a + 1 < batch.active.size() ? batch.first_row[a + 1]
                                                   : static_cast<int64_t>(batch.in.logit_rows.size());
    if (p->steps == 0) {
      // Row r scores the token after fed position first + (r - r0).
      const int64_t first = std::max(p->pos0, p->rank_from);
      p->fed_ranked.resize(static_cast<size_t>(r1 - r0));
      for (int64_t r = r0; r < r1; ++r)
        jobs.add(*p->seq, gumbel_, r, -1, first + (r - r0) + 1, &p->fed_ranked[static_cast<size_t>(r - r0)]);
      continue;
    }
    sampling.push_back(a);
    sample_rows.push_back(r0);
  }
  const auto n = static_cast<int64_t>(sampling.size());
  at::Tensor q;
  if (n > 0) {
    // SAGUARO sampling: sampled token `step` is the next speculation's
    // proposal at fork point `step`, whose F top tokens it downweights.
    DraftRows draw(vocab_, gumbel_);
    const int64_t f = step < static_cast<int64_t>(fanout.size()) ? fanout[step] : 0;
    for (size_t a : sampling) {
      const DraftPath* p = batch.active[a];
      draw.add(p->seq->params, p->seq->seed, p->pos0 + static_cast<int64_t>(p->feed.size()) + step, f,
               config_.saguaro_c);
    }
    q = draw.sample_on(be, select_rows(be, logits, sample_rows), reads_);
    // The rows go to their paths' slots of q_all before the rankings below
    // read back (on the draft's stream), so they are written once decode returns.
    std::vector<int64_t> slots;
    for (size_t a : sampling) slots.push_back(batch.path_index[a] * q_all.size(1) + step);
    copy_rows(be, q, q_all.view({-1, vocab_}), slots);
    for (int64_t r = 0; r < n; ++r) {
      DraftPath* p = batch.active[sampling[r]];
      p->out.push_back(static_cast<int32_t>(draw.tokens[r]));
      // Ranked by the draft's own distribution q: with C < 1 the row sampled
      // from (sigma) pushes down exactly the likeliest target draws.
      const int64_t drawn = config_.saguaro_c < 1.0 ? -1 : r;
      jobs.add(*p->seq, gumbel_, sample_rows[r], drawn, draw.positions[r], &p->ranked[step]);
    }
  }
  rank(jobs, logits, q, ranking);
  return n;
}

void PathDecoder::rank(const RankJobs& jobs, const at::Tensor& logits, const at::Tensor& q, const Ranking& ranking) {
  const model::Backend& be = model_.backend();
  const int64_t depth = ranking.depth;
  if (!jobs.plain_rows.empty()) {
    const auto [ids, probs] = be.top_tokens(select_rows(be, logits, jobs.plain_rows), depth, ranking.probs);
    const at::Tensor host_ids = reads_.read(ids);
    const at::Tensor host_probs = ranking.probs ? reads_.read(probs) : at::Tensor();
    for (size_t i = 0; i < jobs.plain_out.size(); ++i)
      *jobs.plain_out[i] = RankedTokens::top(host_ids.data_ptr<int64_t>() + i * depth,
                                             ranking.probs ? host_probs.data_ptr<float>() + i * depth : nullptr, depth);
  }
  auto perturbed = [&](const at::Tensor& rows, const std::vector<int64_t>& seeds,
                       const std::vector<int64_t>& positions, const std::vector<RankedTokens*>& out) {
    const auto [ids, scores] =
        be.gumbel_top(rows, upload(be, seeds, at::kLong), upload(be, positions, at::kLong), depth);
    const at::Tensor host_ids = reads_.read(ids), host_scores = reads_.read(scores);
    for (size_t i = 0; i < out.size(); ++i)
      *out[i] = RankedTokens::perturbed(host_ids.data_ptr<int64_t>() + i * depth,
                                        host_scores.data_ptr<double>() + i * depth, depth, ranking.probs);
  };
  if (!jobs.processed_rows.empty()) {
    const at::Tensor processed =
        be.process_logits(select_rows(be, logits, jobs.processed_rows), upload(be, jobs.temperature, at::kDouble),
                          upload(be, jobs.top_k, at::kLong), upload(be, jobs.top_p, at::kDouble));
    perturbed(processed, jobs.processed_seeds, jobs.processed_positions, jobs.processed_out);
  }
  if (!jobs.drawn_rows.empty())
    perturbed(select_rows(be, q, jobs.drawn_rows), jobs.drawn_seeds, jobs.drawn_positions, jobs.drawn_out);
}

}  // namespace ssd::runtime
