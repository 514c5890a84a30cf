#include "backend_aten.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "kv_cache.h"

namespace ssd::model {

Matrix AtenBackend::matrix(const at::Tensor& dense, at::ScalarType dtype) const {
  Matrix m;
  m.n = dense.size(0);
  m.k = dense.size(1);
  m.data = dense.to(device_, dtype).to(at::kFloat).contiguous();
  return m;
}

at::Tensor AtenBackend::embed(const at::Tensor& table, const DeviceBatch& b) const {
  return table.index_select(0, b.tokens).to(at::kFloat);
}

void AtenBackend::rms_norm(const at::Tensor& x, const at::Tensor& w, float eps, const at::Tensor& out,
                           StepContext&) const {
  const int64_t n = x.size(-1);
  const at::Tensor rows = x.reshape({-1, n});
  at::Tensor result = at::empty_like(rows, at::MemoryFormat::Contiguous);
  for (int64_t r = 0; r < rows.size(0); ++r) {
    const at::Tensor row = rows[r];
    const at::Tensor inv = at::reciprocal(at::sqrt(row.mul(row).sum() / static_cast<double>(n) + eps));
    result[r].copy_(w * (row * inv));
  }
  out.copy_(result.view(out.sizes()));
}

at::Tensor AtenBackend::linear(const at::Tensor& x, const Matrix& w, const at::Tensor& bias, StepContext&) const {
  const int64_t m = x.size(0);
  at::Tensor y = at::empty({m, w.n}, x.options());
  for (int64_t r = 0; r < m; ++r) {
    at::Tensor out = y[r];
    at::mv_out(out, w.data, x[r]);
  }
  if (bias.defined()) y.add_(bias);
  return y;
}

namespace {

// Cache slots of positions pos [n] int64 whose block-table entries are at
// `entry` [n] of the flattened tables: table[entry] * bs + pos % bs (negative
// for a -1 entry; the callers leave padding tokens out).
at::Tensor slots_of(const at::Tensor& tables, const at::Tensor& entry, const at::Tensor& pos, int64_t bs) {
  return tables.index_select(0, entry).to(at::kLong) * bs + at::remainder(pos, bs);
}

// Whether token t's block-table entry is -1 (padding: no block, slot -1).
bool padding(const ForwardInput& in, int64_t t, int64_t bs) {
  return in.block_tables[in.seq_of_token[t] * in.max_blocks + in.positions[t] / bs] < 0;
}

// Rotary angles positions [T] x inv_freq [d / 2] -> (cos, sin), [T, 1, d / 2].
std::pair<at::Tensor, at::Tensor> rotary(const at::Tensor& positions, const at::Tensor& inv_freq) {
  const at::Tensor angle = (positions.to(at::kFloat).unsqueeze(1) * inv_freq.unsqueeze(0)).unsqueeze(1);
  return {at::cos(angle), at::sin(angle)};
}

// Rotate-half rotary embedding of x [T, H, d] (a view, changed in place).
void rotate(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s) {
  const int64_t half = x.size(2) / 2;
  const at::Tensor a = x.narrow(2, 0, half), b = x.narrow(2, half, half);
  const at::Tensor first = a * c - b * s;
  const at::Tensor second = b * c + a * s;
  a.copy_(first);
  b.copy_(second);
}

}  // namespace

at::Tensor AtenBackend::token_slots(const KvCache& cache, const DeviceBatch& b) const {
  const int64_t bs = cache.block_size();
  const at::Tensor pos = b.positions.to(at::kLong);
  const at::Tensor entry = b.seq_of_token.to(at::kLong) * b.host->max_blocks + at::floor_divide(pos, bs);
  return slots_of(b.block_tables, entry, pos, bs);
}

void AtenBackend::rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& inv_freq, KvCache& cache, int64_t layer, const DeviceBatch& b,
                                StepContext&) const {
  if (row_by_row_) {
    for (int64_t t = 0; t < q.size(0); ++t) {
      const auto [c, s] = rotary(b.positions.narrow(0, t, 1), inv_freq);
      rotate(q.narrow(0, t, 1), c, s);
      rotate(k.narrow(0, t, 1), c, s);
    }
  } else {
    if (!b.rope_cos.defined()) std::tie(b.rope_cos, b.rope_sin) = rotary(b.positions, inv_freq);
    rotate(q, b.rope_cos, b.rope_sin);
    rotate(k, b.rope_cos, b.rope_sin);
  }
  if (!b.slots.defined()) b.slots = token_slots(cache, b);
  // Padding tokens (slot -1) write nothing: only the other rows are copied.
  const ForwardInput& in = *b.host;
  std::vector<int64_t> live;
  for (int64_t t = 0; t < k.size(0); ++t)
    if (!padding(in, t, cache.block_size())) live.push_back(t);
  at::Tensor keys = k, values = v, slots = b.slots;
  if (static_cast<int64_t>(live.size()) != k.size(0)) {
    const at::Tensor rows = at::tensor(live, at::kLong).to(device_);
    keys = k.index_select(0, rows);
    values = v.index_select(0, rows);
    slots = slots.index_select(0, rows);
  }
  const at::Tensor kv = cache.storage()[layer];  // [2, blocks, block_size, Hkv, d], fp32 or bf16
  // To a bf16 cache rounded to nearest even, as kernels::kv_write rounds.
  kv[0].view({-1, k.size(1), k.size(2)}).index_copy_(0, slots, keys.to(kv.scalar_type()));
  kv[1].view({-1, v.size(1), v.size(2)}).index_copy_(0, slots, values.to(kv.scalar_type()));
}

// Query by query: each one's scores, softmax and sum have shapes that depend
// only on its position (and the window), never on the batch. With forks, a
// row's keys below its fork are found through the table it forks from.
at::Tensor AtenBackend::attend_rows(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b,
                                    float scale, int64_t window) const {
  const ForwardInput& in = *b.host;
  const int64_t t_count = q.size(0), hq = q.size(1), d = q.size(2);
  const at::Tensor kv = cache.storage()[layer];
  const int64_t hkv = kv.size(3), bs = cache.block_size();
  const at::Tensor keys = kv[0].view({-1, hkv, d}), values = kv[1].view({-1, hkv, d});
  at::Tensor out = at::empty({t_count, hq * d}, q.options());
  for (int64_t t = 0; t < t_count; ++t) {
    if (padding(in, t, bs)) {  // attends to nothing
      out[t].zero_();
      continue;
    }
    const int64_t end = in.positions[t] + 1;
    const int64_t first = window > 0 ? std::max<int64_t>(0, end - window) : 0;
    const at::Tensor pos = at::arange(first, end, q.options().dtype(at::kLong));
    at::Tensor row = at::full_like(pos, in.seq_of_token[t]);
    if (in.forks()) row.masked_fill_(pos < in.prefix_len[t], int64_t{in.prefix_seq[t]});
    const at::Tensor entry = row * in.max_blocks + at::floor_divide(pos, bs);
    const at::Tensor slots = slots_of(b.block_tables, entry, pos, bs);
    const at::Tensor k = keys.index_select(0, slots).to(at::kFloat).permute({1, 2, 0});  // [Hkv, d, len]
    const at::Tensor v = values.index_select(0, slots).to(at::kFloat).permute({1, 0, 2});  // [Hkv, len, d]
    const at::Tensor qg = q[t].reshape({hkv, hq / hkv, d});
    const at::Tensor probs = at::softmax(at::matmul(qg, k) * scale, -1);
    out[t].copy_(at::matmul(probs, v).reshape({hq * d}));
  }
  return out;
}

at::Tensor AtenBackend::paged_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b,
                                        float scale, int64_t window, StepContext&) const {
  return attend_rows(q, cache, layer, b, scale, window);
}

at::Tensor AtenBackend::fork_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b,
                                       float scale, int64_t window, StepContext&) const {
  return attend_rows(q, cache, layer, b, scale, window);
}

at::Tensor AtenBackend::silu_mul(const at::Tensor& gu) const {
  const int64_t f = gu.size(1) / 2;
  if (!row_by_row_) return at::silu(gu.narrow(1, 0, f)) * gu.narrow(1, f, f);
  at::Tensor out = at::empty({gu.size(0), f}, gu.options());
  for (int64_t r = 0; r < gu.size(0); ++r) out[r].copy_(at::silu(gu[r].narrow(0, 0, f)) * gu[r].narrow(0, f, f));
  return out;
}

void AtenBackend::add(const at::Tensor& x, const at::Tensor& y) const { x.add_(y); }

// Over a [layers * 2, slots, row] view: index_select copies every source row
// out before index_copy_ writes any.
void AtenBackend::copy_kv_slots(KvCache& cache, const std::vector<int64_t>& src_slots,
                                const std::vector<int64_t>& dst_slots) const {
  check_kv_slots(src_slots, dst_slots, cache.num_slots());
  if (src_slots.empty()) return;
  const auto n = static_cast<int64_t>(src_slots.size());
  at::Tensor host = at::empty({2, n}, at::TensorOptions().dtype(at::kLong).pinned_memory(!device_.is_cpu()));
  std::copy(src_slots.begin(), src_slots.end(), host.data_ptr<int64_t>());
  std::copy(dst_slots.begin(), dst_slots.end(), host.data_ptr<int64_t>() + n);
  const at::Tensor slots = device_.is_cpu() ? host : host.to(device_, at::kLong, /*non_blocking=*/true);
  const at::Tensor& storage = cache.storage();
  const at::Tensor planes = storage.view({storage.size(0) * 2, cache.num_slots(), -1});
  planes.index_copy_(1, slots[1], planes.index_select(1, slots[0]));
}

std::unique_ptr<Backend> make_aten_backend(at::Device device) { return std::make_unique<AtenBackend>(device); }

}  // namespace ssd::model
