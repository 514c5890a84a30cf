// Shared by the CPU and CUDA glue of paged_attention and fork_attention:
// argument checks and the CPU threading. Shape, dtype and device checks cost
// nothing on any device. Index values are checked by the CPU glue
// (check_paged_indices); on CUDA that would need a device sync per call, so
// indices are trusted there.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../kernels/cpu/ops.h"
#include "../kernels/cpu/paged_attention.h"
#include "../kernels/cpu/thread_pool.h"
#include "../kernels/key_splits.h"

namespace ssd::attention {

inline void check_f32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
}

inline void check_i32(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must be ", dim, "-D, got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// [rows, heads, head_dim] with each row's heads packed; rows may be strided.
inline void check_rows(const at::Tensor& t, const char* name) {
  check_f32(t, name, 3);
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2),
              name, " must have contiguous [heads, head_dim] rows, got strides ", t.strides());
}

inline void check_same_device(const at::Tensor& ref, std::initializer_list<std::pair<const at::Tensor*, const char*>> ts) {
  for (const auto& [t, name] : ts)
    TORCH_CHECK(t->device() == ref.device(), name, " is on ", t->device(), " but q is on ", ref.device());
}

/// Checks k_cache, v_cache [blocks, block_size, Hkv, D] against q [rows, Hq, D]
/// and block_tables [S, max_blocks].
// bf16: the caches may also both be bfloat16 (paged attention; fork
// attention reads fp32 caches only).
inline void check_paged_cache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& block_tables, bool bf16 = false) {
  check_rows(q, "q");
  if (bf16 && k_cache.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(k_cache.dim() == 4, "k_cache must be 4-D, got shape ", k_cache.sizes());
    TORCH_CHECK(v_cache.scalar_type() == at::kBFloat16, "v_cache must be bfloat16 like k_cache, got ",
                v_cache.scalar_type());
  } else {
    check_f32(k_cache, "k_cache", 4);
    check_f32(v_cache, "v_cache", 4);
  }
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "k_cache and v_cache must have the same shape, got ",
              k_cache.sizes(), " and ", v_cache.sizes());
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "k_cache and v_cache must be contiguous");
  TORCH_CHECK(k_cache.size(3) == q.size(2), "k_cache head_dim ", k_cache.size(3), " != q head_dim ", q.size(2));
  TORCH_CHECK(k_cache.size(1) > 0 && k_cache.size(2) > 0, "k_cache must have block_size > 0 and kv heads > 0");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "q heads (", q.size(1), ") must be a multiple of kv heads (",
              k_cache.size(2), ")");
  check_i32(block_tables, "block_tables", 2);
}

inline void check_out(const at::Tensor& out, const at::Tensor& q) {
  check_rows(out, "out");
  TORCH_CHECK(out.sizes() == q.sizes(), "out must have q's shape ", q.sizes(), ", got ", out.sizes());
}

inline void check_per_row(const at::Tensor& t, const char* name, int64_t rows) {
  check_i32(t, name, 1);
  TORCH_CHECK(t.size(0) == rows, name, " must have ", rows, " entries (one per q row), got ", t.size(0));
}

/// Every shape, dtype and device check of paged_attention, and its window.
inline void check_paged_attention_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                       const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                                       const at::Tensor& positions, const at::Tensor& out, int64_t window) {
  TORCH_CHECK(window >= 0, "window must be >= 0 (0: no sliding window), got ", window);
  check_paged_cache(q, k_cache, v_cache, block_tables, /*bf16=*/true);
  check_per_row(seq_of_token, "seq_of_token", q.size(0));
  check_per_row(positions, "positions", q.size(0));
  check_out(out, q);
  check_same_device(q, {{&k_cache, "k_cache"}, {&v_cache, "v_cache"}, {&block_tables, "block_tables"},
                        {&seq_of_token, "seq_of_token"}, {&positions, "positions"}, {&out, "out"}});
}

/// Every shape, dtype and device check of fork_attention: paged_attention's,
/// and prefix_seq, prefix_len [T] i32.
inline void check_fork_args(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& seq_of_token,
                            const at::Tensor& positions, const at::Tensor& prefix_seq, const at::Tensor& prefix_len,
                            const at::Tensor& out, int64_t window) {
  check_paged_attention_args(q, k_cache, v_cache, block_tables, seq_of_token, positions, out, window);
  check_per_row(prefix_seq, "prefix_seq", q.size(0));
  check_per_row(prefix_len, "prefix_len", q.size(0));
  check_same_device(q, {{&prefix_seq, "prefix_seq"}, {&prefix_len, "prefix_len"}});
}

/// CPU only: seq[i] in [0, num_seqs); returns the largest last[i] of each
/// sequence ([num_seqs], -1 where no row attends to its cache).
inline std::vector<int64_t> max_position_per_seq(const at::Tensor& seq, const char* seq_name,
                                                 const std::vector<int64_t>& last, int64_t num_seqs) {
  std::vector<int64_t> out(static_cast<size_t>(num_seqs), -1);
  const int32_t* s = seq.data_ptr<int32_t>();
  for (int64_t i = 0; i < seq.size(0); ++i) {
    TORCH_CHECK(s[i] >= 0 && s[i] < num_seqs, seq_name, "[", i, "] = ", s[i], " is not a row of block_tables (",
                num_seqs, " rows)");
    out[s[i]] = std::max(out[s[i]], last[i]);
  }
  return out;
}

/// CPU only: every block covering positions 0..max_position[s] of sequence s
/// is a block of the cache, so the kernel never reads outside it.
inline void check_paged_indices(const at::Tensor& block_tables, const std::vector<int64_t>& max_position,
                                int64_t num_blocks, int64_t block_size) {
  const int64_t max_blocks = block_tables.size(1);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  for (int64_t s = 0; s < block_tables.size(0); ++s) {
    const int64_t last = max_position[s];
    if (last < 0) continue;
    TORCH_CHECK(last < max_blocks * block_size, "sequence ", s, " attends to position ", last,
                " beyond its block table (", max_blocks, " blocks of ", block_size, ")");
    for (int64_t b = 0; b <= last / block_size; ++b) {
      const int32_t block = tables[s * max_blocks + b];
      TORCH_CHECK(block >= 0 && block < num_blocks, "block_tables[", s, ", ", b, "] = ", block,
                  " is not a cache block (cache has ", num_blocks, ")");
    }
  }
}

// Multiply-adds (query heads x attended keys x head_dim) below which a call
// runs on the calling thread alone: about a millisecond of work, enough to
// amortise starting a thread (~0.1 ms).
constexpr int64_t kParallelWork = int64_t{1} << 22;

/// Runs fn(begin, end) over [0, units) on a pool of at::get_num_threads()
/// threads made for this call, or inline when work < kParallelWork.
/// at::parallel_for would be the natural choice, but it is serial in code
/// compiled without OpenMP (as this extension is), and a pool kept between
/// calls would be module-global state whose workers spin after every call.
/// Units are independent, so the split never changes a result.
template <typename F>
void run_units(int64_t units, int64_t work, const F& fn) {
  const int64_t threads = work < kParallelWork ? 1 : std::min<int64_t>(at::get_num_threads(), units);
  kernels::ThreadPool pool(threads);
  pool.parallel_for(units, 1, fn);
}

/// The CUDA kernels' split workspace (the split_* fields of
/// kernels/cuda/paged_attention.h) for p.num_heads heads of p.head_dim, as
/// tensors on `options`' device, allocated on the current stream (the
/// kernels' stream: freeing them after the launch is stream-ordered); fills
/// p. Nothing is allocated when max_splits is 1.
template <typename Params>
std::vector<at::Tensor> split_workspace(Params& p, int64_t num_queries, int64_t max_splits,
                                        const at::TensorOptions& options) {
  p.max_splits = max_splits;
  if (max_splits <= 1) return {};
  const int64_t rows = num_queries * max_splits * p.num_heads;
  std::vector<at::Tensor> buffers{at::empty({rows, p.head_dim}, options.dtype(at::kFloat)),
                                  at::empty({2, rows}, options.dtype(at::kFloat)),
                                  at::empty({num_queries}, options.dtype(at::kInt))};
  p.split_partial = buffers[0].data_ptr<float>();
  p.split_max = buffers[1].data_ptr<float>();
  p.split_denom = p.split_max + rows;
  p.split_count = buffers[2].data_ptr<int32_t>();
  return buffers;
}

/// The kernels' view of a k / v cache pair ([blocks, block_size, Hkv, D],
/// fp32 or bf16, checked by check_paged_cache).
inline kernels::PagedKv paged_kv(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  kernels::PagedKv kv;
  kv.block_size = k_cache.size(1);
  kv.num_kv_heads = k_cache.size(2);
  kv.head_dim = k_cache.size(3);
  if (k_cache.scalar_type() == at::kBFloat16) {
    kv.k_bf16 = reinterpret_cast<uint16_t*>(k_cache.data_ptr<at::BFloat16>());
    kv.v_bf16 = reinterpret_cast<uint16_t*>(v_cache.data_ptr<at::BFloat16>());
  } else {
    kv.k = k_cache.data_ptr<float>();
    kv.v = v_cache.data_ptr<float>();
  }
  return kv;
}

/// CUDA: fills the paged attention params of a checked paged or fork
/// attention op call and allocates its split workspace (returned, to be kept
/// until the launch is queued). The most splits any query spans is read off
/// the positions on the host: a sync, as these ops are for tests; the model
/// backend knows the positions on the host.
template <typename Params>
std::vector<at::Tensor> fill_paged_params(Params& p, const at::Tensor& q, const at::Tensor& k_cache,
                                          const at::Tensor& v_cache, const at::Tensor& block_tables,
                                          const at::Tensor& seq_of_token, const at::Tensor& positions, double scale,
                                          const at::Tensor& out, int64_t window) {
  TORCH_CHECK(q.size(2) == 64 || q.size(2) == 128, "attention on CUDA supports head_dim 64 and 128, got ", q.size(2));
  p.q = q.data_ptr<float>();
  p.ldq = q.stride(0);
  p.out = out.data_ptr<float>();
  p.ldo = out.stride(0);
  p.k_cache = k_cache.data_ptr();  // fp32 or bf16 (check_paged_cache checked the dtype)
  p.v_cache = v_cache.data_ptr();
  p.kv_bf16 = k_cache.scalar_type() == at::kBFloat16;
  p.num_heads = q.size(1);
  p.num_kv_heads = k_cache.size(2);
  p.head_dim = q.size(2);
  p.block_size = k_cache.size(1);
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.max_blocks = block_tables.size(1);
  p.scale = static_cast<float>(scale);
  p.num_tokens = q.size(0);
  p.seq_of_token = seq_of_token.data_ptr<int32_t>();
  p.positions = positions.data_ptr<int32_t>();
  p.window = window;
  const at::Tensor last = positions.to(at::kCPU);
  return split_workspace(p, p.num_tokens, kernels::max_key_splits(last.data_ptr<int32_t>(), last.size(0), window),
                         q.options());
}

/// CPU only: the index checks of paged_attention (and of fork attention's
/// own tables): positions >= 0, seq_of_token rows of block_tables whose blocks
/// cover them. Returns the number of attended keys summed over rows.
inline int64_t check_paged_attention_indices(const at::Tensor& k_cache, const at::Tensor& block_tables,
                                             const at::Tensor& seq_of_token, const at::Tensor& positions,
                                             int64_t window) {
  const int32_t* pos = positions.data_ptr<int32_t>();
  std::vector<int64_t> last(static_cast<size_t>(positions.size(0)));
  int64_t keys = 0;
  for (int64_t t = 0; t < positions.size(0); ++t) {
    TORCH_CHECK(pos[t] >= 0, "positions[", t, "] = ", pos[t], " is negative");
    last[t] = pos[t];
    keys += window > 0 ? std::min<int64_t>(int64_t{pos[t]} + 1, window) : int64_t{pos[t]} + 1;
  }
  const auto max_position = max_position_per_seq(seq_of_token, "seq_of_token", last, block_tables.size(0));
  check_paged_indices(block_tables, max_position, k_cache.size(0), k_cache.size(1));
  return keys;
}

/// CPU only: the kernel params of a checked paged_attention call.
inline kernels::PagedAttentionParams paged_params(const at::Tensor& q, const at::Tensor& k_cache,
                                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                                  const at::Tensor& seq_of_token, const at::Tensor& positions,
                                                  double scale, const at::Tensor& out, int64_t window) {
  return {paged_kv(k_cache, v_cache), q.data_ptr<float>(), q.stride(0), out.data_ptr<float>(), out.stride(0),
          q.size(0), q.size(1), seq_of_token.data_ptr<int32_t>(), positions.data_ptr<int32_t>(),
          block_tables.data_ptr<int32_t>(), block_tables.size(1), static_cast<float>(scale), window};
}

/// CPU only: an op's work units (units(plan, begin, end)) and the combine,
/// on run_units' threads for `keys` attended keys in all.
template <typename Units>
void run_op_units(kernels::AttentionPlan& plan, const kernels::PagedAttentionParams& p, int64_t keys, Units units) {
  kernels::run_attention(
      plan, p.kv.num_kv_heads, p.tokens, p.out, p.ldo, p.num_heads, p.kv.head_dim,
      [&](int64_t count, const auto& fn) { run_units(count, keys * p.num_heads * p.kv.head_dim, fn); }, units);
}

}  // namespace ssd::attention
