// Paged attention on NVIDIA GPUs (prefill, decode and multi-token verify in
// one launch): paged_query.cuh's query over a sequence's paged cache. The CPU
// kernel (kernels/cpu/paged_attention.cpp) is the oracle.
#include "paged_attention.h"

#include "paged_query.cuh"

namespace ssd::kernels::cuda {

namespace {

template <int D, typename T>
__global__ void __launch_bounds__(attention::kThreads) paged_attention_kernel(PagedAttentionParams p) {
  paged::attend_query<D, T>(p, [&](const T* k, const T* v, const int32_t* table) {
    return paged::PagedKeys<T>{k, v, table, static_cast<int>(p.block_size), p.num_kv_heads * D};
  });
}

template <int D, typename T>
struct PagedKernel {
  static void launch(dim3 grid, cudaStream_t stream, const PagedAttentionParams& p) {
    paged_attention_kernel<D, T><<<grid, attention::kThreads, 0, stream>>>(p);
  }
};

}  // namespace

cudaError_t paged_attention(const PagedAttentionParams& params, cudaStream_t stream) {
  return paged::launch<PagedKernel>(params, params, stream);
}

}  // namespace ssd::kernels::cuda
