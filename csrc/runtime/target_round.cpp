#include "target_round.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../kernels/cpu/sampling.h"

namespace ssd::runtime {

namespace {

using kernels::RandomPurpose;

double uniform(uint64_t seed, int64_t position, RandomPurpose purpose) {
  return kernels::keyed_uniform(seed, static_cast<uint64_t>(position), purpose);
}

// The round's elementwise passes over whole rows. On a GPU they are ATen
// ops on the model's stream; on the CPU plain loops on the engine's thread,
// since ATen's would wake its OpenMP pool beside the engine's own kernel
// threads (measurably slower decode on a few cores).

/// [rows] bool: whether each row of logits [rows, vocab] holds a NaN; the NaNs
/// are zeroed in place (infinities kept), so no kernel sees one.
at::Tensor clean_nan_rows(const at::Tensor& logits) {
  if (!logits.device().is_cpu()) {
    at::Tensor flags = at::isnan(logits).any(1);
    logits.nan_to_num_(0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity());
    return flags;
  }
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  at::Tensor flags = at::zeros({rows}, at::kBool);
  float* x = logits.data_ptr<float>();
  bool* f = flags.data_ptr<bool>();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * logits.stride(0);
    for (int64_t v = 0; v < vocab; ++v)
      if (std::isnan(row[v])) {
        row[v] = 0.0f;
        f[r] = true;
      }
  }
  return flags;
}

/// x [rows, vocab] -> x[index] [index.size(), vocab].
at::Tensor select_rows(const at::Tensor& x, const std::vector<int64_t>& index, const at::Tensor& device_index) {
  if (!x.device().is_cpu()) return x.index_select(0, device_index);
  const int64_t vocab = x.size(1);
  at::Tensor out = at::empty({static_cast<int64_t>(index.size()), vocab}, x.options());
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (size_t i = 0; i < index.size(); ++i)
    std::copy(src + index[i] * x.stride(0), src + index[i] * x.stride(0) + vocab, dst + static_cast<int64_t>(i) * vocab);
  return out;
}

}  // namespace

/// One item as verified: its settings (faults applied) and its proposals.
struct TargetRound::Row {
  const Sequence* seq = nullptr;
  SamplingParams params;         ///< the settings its draws use
  int64_t key = 0;               ///< position keying the draw of its first row
  std::vector<int64_t> tokens;   ///< the proposals verified
  at::Tensor q;                  ///< [>= tokens, vocab] rows drawn from (the draft's device), or undefined
  bool one_hot = false;
  bool drawn = false;            ///< no proposal: a prefill's token
  int64_t first_row = 0;

  int64_t count() const { return static_cast<int64_t>(tokens.size()); }
};

TargetRound::TargetRound(const model::Backend& backend, int64_t vocab, const TestingConfig& testing,
                         const Coupling& coupling)
    : backend_(backend), vocab_(vocab), testing_(testing), coupling_(coupling) {}

TargetRound::Row TargetRound::prepare(const RoundItem& item) {
  Row r;
  r.seq = item.seq;
  r.params = item.seq->params;
  r.first_row = item.first_row;
  r.key = item.seq->len();
  if (item.proposal == nullptr) {
    r.drawn = true;
    return r;
  }
  const Proposal& p = *item.proposal;
  if (testing_.fault_batch_top_kp) {
    if (!has_first_) first_ = item.seq->params;
    has_first_ = true;
    r.params.top_k = first_.top_k;
    r.params.top_p = first_.top_p;
  }
  if (testing_.fault_resume_stream && item.seq->preempted_len > 0) r.key = item.seq->preempted_len;
  r.tokens = p.tokens;
  r.q = p.q;
  r.one_hot = p.one_hot;
  return r;
}

int64_t TargetRound::peek(const at::Tensor& logits, const RoundItem& item, const SamplingParams& params) {
  const Proposal& p = *item.proposal;
  const auto n = static_cast<int64_t>(p.tokens.size());
  if (n == 0) return 0;
  const at::Tensor rows = logits.narrow(0, item.first_row, n);
  const at::Tensor probs = backend_.process_logits(rows, upload(std::vector<double>(n, params.temperature), at::kDouble),
                                                   upload(std::vector<int64_t>(n, params.top_k), at::kLong),
                                                   upload(std::vector<double>(n, params.top_p), at::kDouble));
  const at::Tensor px = read(probs.gather(1, upload(p.tokens, at::kLong).unsqueeze(1)).squeeze(1));
  const at::Tensor q = p.q.narrow(0, 0, n).to(at::kCPU).contiguous();  // a testing fault: not counted
  const float* pv = px.data_ptr<float>();
  const float* qv = q.data_ptr<float>();
  int64_t keep = 0;
  while (keep < n && !(pv[keep] < qv[keep * vocab_ + p.tokens[keep]])) ++keep;
  return keep;
}

std::vector<RoundOutcome> TargetRound::run(const at::Tensor& logits, const std::vector<RoundItem>& items) {
  std::vector<RoundOutcome> out(items.size());
  if (items.empty()) return out;
  std::vector<Row> rows;
  for (const RoundItem& item : items) {
    Row r = prepare(item);
    if (testing_.fault_peek_target && !r.drawn && !r.one_hot && r.q.defined() && r.params.temperature > 0)
      r.tokens.resize(static_cast<size_t>(peek(logits, item, r.params)));
    rows.push_back(std::move(r));
  }
  // A NaN row fails its item; the rows are cleaned in place (infinities
  // kept) so that no kernel sees a NaN. The flags come back with the outcome.
  const at::Tensor row_nan = clean_nan_rows(logits);
  const at::Tensor outcome = coupling_.gumbel ? draw_gumbel(logits, rows) : draw_rejection(logits, rows);
  const at::Tensor nan = read(row_nan);
  const at::Tensor h = read(outcome);
  const int64_t* v = h.data_ptr<int64_t>();
  const auto b = static_cast<int64_t>(rows.size());
  for (int64_t i = 0; i < b; ++i) {
    const Row& r = rows[i];
    for (int64_t j = 0; j < item_rows(items[i]); ++j)
      if (nan.data_ptr<bool>()[r.first_row + j]) out[i].error = "logits contain NaN";
    if (coupling_.gumbel) {
      // Accepted while each proposal equals the target's draw at its position.
      const int64_t* drawn = v + r.first_row;
      int64_t a = 0;
      while (a < r.count() && r.tokens[a] == drawn[a]) ++a;
      out[i].verdict = {a, static_cast<int32_t>(drawn[a])};
    } else {
      out[i].verdict = {v[i], static_cast<int32_t>(v[b + i])};
    }
  }
  report_logprobs(logits, items, out);
  return out;
}

int64_t TargetRound::item_rows(const RoundItem& item) {
  return 1 + (item.proposal != nullptr ? static_cast<int64_t>(item.proposal->tokens.size()) : 0);
}

at::Tensor TargetRound::draw_rejection(const at::Tensor& logits, const std::vector<Row>& rows) {
  // Each item's rows 0..n, padded to k + 1 by repeating its last row (read by
  // nothing, but never another item's): verify's [B, K + 1, V] layout.
  const auto b = static_cast<int64_t>(rows.size());
  int64_t k = 1;  // proposal slots: the kernel takes at least one
  for (const Row& r : rows) k = std::max(k, r.count());
  std::vector<int64_t> index;
  index.reserve(static_cast<size_t>(b * (k + 1)));
  for (const Row& r : rows)
    for (int64_t i = 0; i <= k; ++i) index.push_back(r.first_row + std::min(i, r.count()));
  std::vector<int64_t> proposals(static_cast<size_t>(b * k), 0), num(static_cast<size_t>(b)), top_k(num);
  std::vector<double> temperature(static_cast<size_t>(b)), top_p(temperature), bonus_u(temperature);
  std::vector<double> accept_u(static_cast<size_t>(b * k), 0.0);
  std::vector<uint8_t> one_hot(static_cast<size_t>(b));
  bool reads_q = false;
  for (int64_t i = 0; i < b; ++i) {
    const Row& r = rows[i];
    const uint64_t seed = r.seq->seed;
    std::copy(r.tokens.begin(), r.tokens.end(), proposals.begin() + i * k);
    num[i] = r.count();
    one_hot[i] = r.one_hot;
    temperature[i] = r.one_hot && testing_.fault_fast_argmax ? 0.0 : r.params.temperature;
    top_k[i] = r.params.top_k;
    top_p[i] = r.params.top_p;
    for (int64_t j = 0; j < r.count(); ++j) accept_u[i * k + j] = uniform(seed, r.key + j, RandomPurpose::kAccept);
    bonus_u[i] = r.drawn ? uniform(seed, r.key, RandomPurpose::kSample) : uniform(seed, r.key, RandomPurpose::kResidual);
    reads_q = reads_q || (!r.one_hot && r.count() > 0 && temperature[i] > 0);
  }
  model::VerifyBatch v;
  const bool cpu = logits.device().is_cpu();
  v.target_logits = select_rows(logits, index, cpu ? at::Tensor() : upload(index, at::kLong)).view({b, k + 1, vocab_});
  v.proposals = upload(proposals, at::kLong).view({b, k});
  v.num_proposals = upload(num, at::kLong);
  if (reads_q) v.q_probs = gather_q(rows, k);
  v.one_hot = upload(one_hot, at::kBool);
  v.temperature = upload(temperature, at::kDouble);
  v.top_k = upload(top_k, at::kLong);
  v.top_p = upload(top_p, at::kDouble);
  v.accept_uniforms = upload(accept_u, at::kDouble).view({b, k});
  v.bonus_uniforms = upload(bonus_u, at::kDouble);
  const auto [accepted, bonus] = backend_.verify(v);
  return at::cat({accepted, bonus});  // [2B]: accepted, then bonus
}

at::Tensor TargetRound::gather_q(const std::vector<Row>& rows, int64_t k) const {
  const auto b = static_cast<int64_t>(rows.size());
  const at::Device device = backend_.device();
  at::Tensor q = at::empty({b, k, vocab_}, at::TensorOptions().dtype(at::kFloat).device(device));
  if (!device.is_cpu()) {
    // Device to device (a peer copy when the draft has its own GPU; from the
    // host when the draft's rows are there), on the target's stream.
    q.zero_();
    for (int64_t i = 0; i < b; ++i) {
      const Row& r = rows[i];
      if (r.one_hot || !r.q.defined() || r.count() == 0) continue;
      q[i].narrow(0, 0, r.count()).copy_(r.q.narrow(0, 0, r.count()), /*non_blocking=*/true);
    }
    return q;
  }
  // On the CPU plain copies (see clean_nan_rows).
  float* dst = q.data_ptr<float>();
  std::fill_n(dst, q.numel(), 0.0f);
  for (int64_t i = 0; i < b; ++i) {
    const Row& r = rows[i];
    if (r.one_hot || !r.q.defined() || r.count() == 0) continue;
    const at::Tensor src = r.q.narrow(0, 0, r.count()).to(at::kCPU).contiguous();
    std::copy_n(src.data_ptr<float>(), src.numel(), dst + i * k * vocab_);
  }
  return q;
}

at::Tensor TargetRound::draw_gumbel(const at::Tensor& logits, const std::vector<Row>& rows) {
  // Every row of the forward is some item's row j, drawn at position key + j.
  const int64_t n = logits.size(0);
  std::vector<double> temperature(static_cast<size_t>(n)), top_p(temperature);
  std::vector<int64_t> top_k(static_cast<size_t>(n)), seeds(top_k), positions(top_k);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const int64_t end = i + 1 < rows.size() ? rows[i + 1].first_row : n;
    for (int64_t row = r.first_row; row < end; ++row) {
      temperature[row] = r.params.temperature;
      top_k[row] = r.params.top_k;
      top_p[row] = r.params.top_p;
      seeds[row] = static_cast<int64_t>(r.seq->seed);
      positions[row] = static_cast<int64_t>(coupling_.noise_position(r.key + (row - r.first_row)));
    }
  }
  const at::Tensor probs = backend_.process_logits(logits, upload(temperature, at::kDouble), upload(top_k, at::kLong),
                                                   upload(top_p, at::kDouble));
  return backend_.gumbel_sample(probs, upload(seeds, at::kLong), upload(positions, at::kLong));  // [rows]
}

void TargetRound::report_logprobs(const at::Tensor& logits, const std::vector<RoundItem>& items,
                                  std::vector<RoundOutcome>& out) {
  // Every emitted token of every item that asked: its row and its request's own settings.
  std::vector<int64_t> row_index, tokens, top_k, owner;
  std::vector<double> temperature, top_p;
  int64_t depth = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const SamplingParams& p = items[i].seq->params;
    if (p.logprobs < 0 || !out[i].error.empty()) continue;
    const Verdict& v = out[i].verdict;
    for (int64_t j = 0; j <= v.accepted; ++j) {
      row_index.push_back(items[i].first_row + j);
      tokens.push_back(j < v.accepted ? items[i].proposal->tokens[j] : v.bonus);
      temperature.push_back(p.temperature);
      top_k.push_back(p.top_k);
      top_p.push_back(p.top_p);
      owner.push_back(static_cast<int64_t>(i));
    }
    depth = std::max<int64_t>(depth, std::min<int64_t>(p.logprobs, vocab_));
  }
  if (row_index.empty()) return;
  const auto m = static_cast<int64_t>(row_index.size());
  const at::Tensor probs = backend_.process_logits(logits.index_select(0, upload(row_index, at::kLong)),
                                                   upload(temperature, at::kDouble), upload(top_k, at::kLong),
                                                   upload(top_p, at::kDouble));
  const at::Tensor chosen = read(probs.gather(1, upload(tokens, at::kLong).unsqueeze(1)).squeeze(1));
  at::Tensor best_p, best_id;
  if (depth > 0) {
    // Ranked by (probability desc, id asc): a stable sort keeps equal ones in id order.
    const auto [values, ids] = probs.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
    best_p = read(values.narrow(1, 0, depth));
    best_id = read(ids.narrow(1, 0, depth));
  }
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = owner[r];
    TokenLogprobs lp;
    lp.logprob = static_cast<float>(std::log(static_cast<double>(chosen.data_ptr<float>()[r])));
    const int64_t n = std::min<int64_t>(items[i].seq->params.logprobs, vocab_);
    for (int64_t j = 0; j < n; ++j) {
      const float pj = best_p.data_ptr<float>()[r * depth + j];
      if (!(pj > 0.0f)) break;
      lp.top_tokens.push_back(static_cast<int32_t>(best_id.data_ptr<int64_t>()[r * depth + j]));
      lp.top_logprobs.push_back(static_cast<float>(std::log(static_cast<double>(pj))));
    }
    out[i].logprobs.push_back(std::move(lp));
  }
}

}  // namespace ssd::runtime
