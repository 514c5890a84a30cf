// Fork attention on NVIDIA GPUs: paged_query.cuh's query whose keys below
// the row's fork are read through the table of the sequence it forks from.
// The CPU kernel (kernels/cpu/fork_attention.cpp) is the oracle.
#include "fork_attention.h"

#include "paged_query.cuh"

namespace ssd::kernels::cuda {

namespace {

template <int D, typename T>
__global__ void __launch_bounds__(attention::kThreads) fork_attention_kernel(ForkAttentionParams f) {
  const PagedAttentionParams& p = f.paged;
  const int64_t t = blockIdx.x;
  const int32_t* prefix_table = p.block_tables + static_cast<int64_t>(f.prefix_seq[t]) * p.max_blocks;
  const int fork = f.prefix_len[t];
  paged::attend_query<D, T>(p, [&](const T* k, const T* v, const int32_t* table) {
    return paged::ForkKeys<T>{k, v, prefix_table, table, fork, static_cast<int>(p.block_size), p.num_kv_heads * D};
  });
}

template <int D, typename T>
struct ForkKernel {
  static void launch(dim3 grid, cudaStream_t stream, const ForkAttentionParams& p) {
    fork_attention_kernel<D, T><<<grid, attention::kThreads, 0, stream>>>(p);
  }
};

}  // namespace

cudaError_t fork_attention(const ForkAttentionParams& params, cudaStream_t stream) {
  return paged::launch<ForkKernel>(params, params.paged, stream);
}

}  // namespace ssd::kernels::cuda
