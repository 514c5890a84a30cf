// One query of paged or fork attention on NVIDIA GPUs: the block's share of
// query row t (one kv head, a chunk of its query heads, one split of its
// keys) over the keys a Keys object finds, with the schedule of
// attention_common.cuh. Paged attention reads every key through the row's
// block table; fork attention reads the keys below the row's fork through
// the table of the sequence it forks from.
#pragma once

#include "attention_common.cuh"
#include "paged_attention.h"

namespace ssd::kernels::cuda::paged {

using attention::kMaxGroup;

// Key i is position i; its slot is table[i / block_size] * block_size +
// i % block_size; T: float or bf16 bits.
inline __device__ int64_t slot_of(const int32_t* table, int pos, int block_size) {
  return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
}

// Positions 0, 1, ... of one sequence, for one kv head, through its table.
template <typename T>
struct PagedKeys {
  const T* k;  // cache base + kv_head * D
  const T* v;
  const int32_t* table;
  int block_size;
  int64_t row;  // values per cache slot: num_kv_heads * D

  __device__ const T* k_row(int i) const { return k + slot_of(table, i, block_size) * row; }
  __device__ const T* v_row(int i) const { return v + slot_of(table, i, block_size) * row; }
};

// The same, the positions below `fork` through the prefix's table.
template <typename T>
struct ForkKeys {
  const T* k;
  const T* v;
  const int32_t* prefix_table;
  const int32_t* table;
  int fork;
  int block_size;
  int64_t row;

  __device__ int64_t slot(int i) const { return slot_of(i < fork ? prefix_table : table, i, block_size); }
  __device__ const T* k_row(int i) const { return k + slot(i) * row; }
  __device__ const T* v_row(int i) const { return v + slot(i) * row; }
};

__host__ __device__ inline attention::SplitWorkspace workspace(const PagedAttentionParams& p) {
  return {static_cast<int>(p.max_splits), p.split_partial, p.split_max, p.split_denom, p.split_count};
}

// Block (t, kv_head, z): z % chunks is the chunk of up to kMaxGroup query
// heads, z / chunks the split of t's keys. keys_of(k, v, table) makes the
// Keys of row t for the kv head's cache columns k, v and the row's own table.
template <int D, typename T, typename KeysOf>
__device__ __forceinline__ void attend_query(const PagedAttentionParams& p, KeysOf keys_of) {
  const int64_t t = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int chunk = static_cast<int>(blockIdx.z) % chunks, split = static_cast<int>(blockIdx.z) / chunks;
  const int first = chunk * kMaxGroup;
  const int64_t head0 = static_cast<int64_t>(kv_head) * group + first;
  const attention::SplitWorkspace ws = workspace(p);
  const int32_t* table = p.block_tables + static_cast<int64_t>(p.seq_of_token[t]) * p.max_blocks;
  if (table[p.positions[t] / p.block_size] < 0) {  // padding (no block): attends to nothing, output 0
    if (split != 0) return;
    if (chunk == 0 && threadIdx.x == 0 && ws.splits != nullptr) ws.splits[t] = 0;
    float* out = p.out + t * p.ldo + head0 * D;
    for (int i = threadIdx.x; i < min(kMaxGroup, group - first) * D; i += attention::kThreads) out[i] = 0.0f;
    return;
  }
  const int n = p.positions[t] + 1;
  const int first_key = static_cast<int>(window_first_key(n, p.window));
  const auto keys = keys_of(static_cast<const T*>(p.k_cache) + kv_head * D, static_cast<const T*>(p.v_cache) + kv_head * D,
                            table);
  attention::attend_split<D>(keys, first_key, n, split, chunk, p.q + t * p.ldq + head0 * D,
                             p.out + t * p.ldo + head0 * D, min(kMaxGroup, group - first), p.scale, ws, t, head0,
                             p.num_heads);
}

inline bool valid(const PagedAttentionParams& p) {
  const int64_t chunks = (p.num_heads / p.num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  return attention::head_dim_supported(p.head_dim) && p.num_kv_heads > 0 && p.num_kv_heads <= 65535 &&
         p.window >= 0 && p.max_splits >= 1 && chunks * p.max_splits <= 65535 &&
         (p.max_splits == 1 || (p.split_partial && p.split_max && p.split_denom && p.split_count)) &&
         p.num_heads % p.num_kv_heads == 0 && p.block_size > 0 && p.num_tokens <= 0x7fffffff &&
         attention::aligned16(p.k_cache) && attention::aligned16(p.v_cache);
}

// kernel<D, T> over the cache's type on grid (tokens, kv heads, chunks x
// splits), then the merge of split queries.
template <template <int, typename> class Kernel, typename Params>
cudaError_t launch(const Params& params, const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_tokens == 0) return cudaSuccess;
  if (p.num_kv_heads <= 0 || !valid(p)) return cudaErrorInvalidValue;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(p.num_tokens), static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>((group + kMaxGroup - 1) / kMaxGroup * p.max_splits));
  const auto run = [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (p.kv_bf16)
      Kernel<D, uint16_t>::launch(grid, stream, params);
    else
      Kernel<D, float>::launch(grid, stream, params);
    if (cudaPeekAtLastError() != cudaSuccess) return cudaGetLastError();
    return attention::combine_splits<D>(p.out, p.ldo, p.num_tokens, p.num_heads, workspace(p), stream);
  };
  if (p.head_dim == 64) return run(std::integral_constant<int, 64>{});
  return run(std::integral_constant<int, 128>{});
}

}  // namespace ssd::kernels::cuda::paged
