#include "dense_attention.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace ssd::model {

std::vector<PrefillRun> prefill_runs(const ForwardInput& in, int64_t block_size, int64_t min_run_tokens) {
  const auto t = static_cast<int64_t>(in.tokens.size());
  if (in.forks() || t == 0) return {};
  const int64_t seqs = in.max_blocks > 0 ? static_cast<int64_t>(in.block_tables.size()) / in.max_blocks : 0;
  std::vector<bool> seen(static_cast<size_t>(seqs), false);
  std::vector<PrefillRun> runs;
  for (int64_t i = 0; i < t; ++i) {
    const int64_t seq = in.seq_of_token[i], pos = in.positions[i];
    if (seq < 0 || seq >= seqs || in.block_tables[seq * in.max_blocks + pos / block_size] < 0) return {};
    if (!runs.empty() && runs.back().seq == seq) {
      if (pos != runs.back().first_position + runs.back().tokens) return {};
      ++runs.back().tokens;
      continue;
    }
    if (seen[seq]) return {};  // a sequence in two runs
    seen[seq] = true;
    runs.push_back({i, seq, pos, 1});
  }
  for (const PrefillRun& r : runs)
    if (r.tokens < min_run_tokens) return {};
  return runs;
}

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const std::vector<PrefillRun>& runs, const ForwardInput& in, float scale, int64_t window,
                           at::ScalarType compute) {
  const int64_t hq = q.size(1), d = q.size(2), hkv = k_cache.size(2), bs = k_cache.size(1);
  // A run's keys: from the first its first query sees (a sliding window's
  // earlier blocks may be gone) to its last query. Every run's key slots,
  // one host array and one copy.
  const auto first_key = [&](const PrefillRun& r) {
    return window > 0 ? std::max<int64_t>(0, r.first_position + 1 - window) : int64_t{0};
  };
  std::vector<int64_t> slots;
  for (const PrefillRun& r : runs)
    for (int64_t j = first_key(r); j < r.first_position + r.tokens; ++j)
      slots.push_back(int64_t{in.block_tables[r.seq * in.max_blocks + j / bs]} * bs + j % bs);
  const bool cpu = q.device().is_cpu();
  const at::Tensor host = at::tensor(slots, at::TensorOptions().dtype(at::kLong));
  const at::Tensor slot_index = cpu ? host : host.pin_memory().to(q.device(), at::kLong, /*non_blocking=*/true);
  const at::Tensor keys = k_cache.view({-1, hkv, d}).index_select(0, slot_index).to(compute);  // [sum keys, Hkv, d]
  const at::Tensor values = v_cache.view({-1, hkv, d}).index_select(0, slot_index).to(compute);
  at::Tensor out = at::empty({q.size(0), hq * d}, q.options().dtype(at::kFloat));
  int64_t offset = 0;  // the run's first key row in keys / values
  for (const PrefillRun& r : runs) {
    const int64_t n = r.tokens, k0 = first_key(r), keys_n = r.first_position + n - k0;
    // [1, H, len, d]; the kv heads repeated to the query heads (GQA)
    const auto heads = [&](const at::Tensor& x) {
      return x.narrow(0, offset, keys_n).repeat_interleave(hq / hkv, 1).transpose(0, 1).unsqueeze(0);
    };
    const at::Tensor qr = q.narrow(0, r.row, n).to(compute).transpose(0, 1).unsqueeze(0);
    at::Tensor o;
    if (r.first_position == 0 && window <= 0) {
      o = at::scaled_dot_product_attention(qr, heads(keys), heads(values), {}, 0.0, /*is_causal=*/true, scale);
    } else {  // query i at position p0 + i sees keys j <= p0 + i (and, in a window, j > p0 + i - window)
      const at::Tensor qpos =
          at::arange(r.first_position, r.first_position + n, q.options().dtype(at::kLong)).unsqueeze(1);
      const at::Tensor kpos = at::arange(k0, k0 + keys_n, q.options().dtype(at::kLong)).unsqueeze(0);
      at::Tensor mask = kpos.le(qpos);
      if (window > 0) mask = mask.logical_and(kpos.gt(qpos - window));
      o = at::scaled_dot_product_attention(qr, heads(keys), heads(values), mask, 0.0, false, scale);
    }
    out.narrow(0, r.row, n).copy_(o.squeeze(0).transpose(0, 1).reshape({n, hq * d}));
    offset += keys_n;
  }
  return out;
}

}  // namespace ssd::model
