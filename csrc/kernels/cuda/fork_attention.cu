// Fork attention on NVIDIA GPUs: one query per tree branch over its
// sequence's prefix pages, then its own path slots, with the schedule of
// attention_common.cuh. The CPU kernel (kernels/cpu/fork_attention.cpp) is
// the oracle.
#include "fork_attention.h"

#include "attention_common.cuh"

namespace ssd::kernels::cuda {

namespace {

using attention::kMaxGroup;

// Keys 0..prefix-1 from the paged cache, then the branch's path slots.
struct ForkKeys {
  const float* k;  // cache base + kv_head * D
  const float* v;
  const float* path_k;  // this branch's slot 0 + kv_head * D
  const float* path_v;
  const int32_t* table;
  int block_size;
  int prefix;
  int64_t row;  // floats per cache slot and per path slot: num_kv_heads * D

  __device__ int64_t offset(int i) const {
    if (i >= prefix) return (i - prefix) * row;
    return (static_cast<int64_t>(table[i / block_size]) * block_size + i % block_size) * row;
  }
  __device__ const float* k_row(int i) const { return (i < prefix ? k : path_k) + offset(i); }
  __device__ const float* v_row(int i) const { return (i < prefix ? v : path_v) + offset(i); }
};

__host__ __device__ attention::SplitWorkspace workspace(const ForkAttentionParams& p) {
  return {static_cast<int>(p.max_splits), p.split_partial, p.split_max, p.split_denom, p.split_count};
}

// Block (n, kv_head, z): z % chunks is the chunk of up to kMaxGroup query
// heads, z / chunks the split of branch n's keys.
template <int D>
__global__ void __launch_bounds__(attention::kThreads) fork_attention_kernel(ForkAttentionParams p) {
  const int64_t n = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int group = static_cast<int>(p.num_heads / p.num_kv_heads);
  const int chunks = (group + kMaxGroup - 1) / kMaxGroup;
  const int chunk = static_cast<int>(blockIdx.z) % chunks, split = static_cast<int>(blockIdx.z) / chunks;
  const int first = chunk * kMaxGroup;
  const int64_t head0 = static_cast<int64_t>(kv_head) * group + first;
  const int64_t row = p.num_kv_heads * D;
  const int64_t path0 = n * p.max_path * row + kv_head * D;
  const ForkKeys keys{p.k_cache + kv_head * D,
                      p.v_cache + kv_head * D,
                      p.path_k + path0,
                      p.path_v + path0,
                      p.block_tables + static_cast<int64_t>(p.branch_seq[n]) * p.max_blocks,
                      static_cast<int>(p.block_size),
                      p.prefix_len[n],
                      row};
  attention::attend_split<D>(keys, 0, p.prefix_len[n] + p.path_len[n], split, chunk, p.q + n * p.ldq + head0 * D,
                             p.out + n * p.ldo + head0 * D, min(kMaxGroup, group - first), p.scale, workspace(p), n,
                             head0, p.num_heads);
}

bool valid(const ForkAttentionParams& p) {
  const int64_t chunks = (p.num_heads / p.num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  return attention::head_dim_supported(p.head_dim) && p.num_kv_heads > 0 && p.num_kv_heads <= 65535 &&
         p.max_splits >= 1 && chunks * p.max_splits <= 65535 &&
         (p.max_splits == 1 || (p.split_partial && p.split_max && p.split_denom && p.split_count)) &&
         p.num_heads % p.num_kv_heads == 0 && p.block_size > 0 && p.max_path > 0 &&
         p.num_branches <= 0x7fffffff && attention::aligned16(p.k_cache) && attention::aligned16(p.v_cache) &&
         attention::aligned16(p.path_k) && attention::aligned16(p.path_v);
}

// The kernel, then the merge of split branches.
template <int D>
cudaError_t launch(const ForkAttentionParams& p, dim3 grid, cudaStream_t stream) {
  fork_attention_kernel<D><<<grid, attention::kThreads, 0, stream>>>(p);
  if (cudaPeekAtLastError() != cudaSuccess) return cudaGetLastError();
  return attention::combine_splits<D>(p.out, p.ldo, p.num_branches, p.num_heads, workspace(p), stream);
}

}  // namespace

cudaError_t fork_attention(const ForkAttentionParams& params, cudaStream_t stream) {
  if (params.num_branches == 0) return cudaSuccess;
  if (params.num_kv_heads <= 0 || !valid(params)) return cudaErrorInvalidValue;
  const int64_t group = params.num_heads / params.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(params.num_branches), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>((group + kMaxGroup - 1) / kMaxGroup * params.max_splits));
  if (params.head_dim == 64) return launch<64>(params, grid, stream);
  return launch<128>(params, grid, stream);
}

}  // namespace ssd::kernels::cuda
