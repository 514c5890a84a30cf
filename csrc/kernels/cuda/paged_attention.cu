// Paged attention on NVIDIA GPUs (prefill, decode and multi-token verify in
// one launch): the schedule of attention_common.cuh over a sequence's paged
// cache. The CPU kernel (kernels/cpu/paged_attention.cpp) is the oracle.
#include "paged_attention.h"

#include "attention_common.cuh"

namespace ssd::kernels::cuda {

namespace {

using attention::kMaxGroup;

// Positions 0, 1, ... of one sequence (key i is position i), for one kv
// head, through its block table; T: float or bf16 bits.
template <typename T>
struct PagedKeys {
  const T* k;  // cache base + kv_head * D
  const T* v;
  const int32_t* table;
  int block_size;
  int64_t row;  // floats per cache slot: num_kv_heads * D

  __device__ int64_t slot(int pos) const {
    return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
  }
  __device__ const T* k_row(int i) const { return k + slot(i) * row; }
  __device__ const T* v_row(int i) const { return v + slot(i) * row; }
};

__host__ __device__ attention::SplitWorkspace workspace(const PagedAttentionParams& p) {
  return {static_cast<int>(p.max_splits), p.split_partial, p.split_max, p.split_denom, p.split_count};
}

// Block (t, kv_head, z): z % chunks is the chunk of up to kMaxGroup query
// heads, z / chunks the split of t's keys.
template <int D, typename T>
__global__ void __launch_bounds__(attention::kThreads) paged_attention_kernel(PagedAttentionParams p) {
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
  const PagedKeys<T> keys{static_cast<const T*>(p.k_cache) + kv_head * D, static_cast<const T*>(p.v_cache) + kv_head * D,
                          table, static_cast<int>(p.block_size), p.num_kv_heads * D};
  attention::attend_split<D>(keys, first_key, n, split, chunk, p.q + t * p.ldq + head0 * D,
                             p.out + t * p.ldo + head0 * D, min(kMaxGroup, group - first), p.scale, ws, t, head0,
                             p.num_heads);
}

bool valid(const PagedAttentionParams& p) {
  const int64_t chunks = (p.num_heads / p.num_kv_heads + kMaxGroup - 1) / kMaxGroup;
  return attention::head_dim_supported(p.head_dim) && p.num_kv_heads > 0 && p.num_kv_heads <= 65535 &&
         p.window >= 0 && p.max_splits >= 1 && chunks * p.max_splits <= 65535 &&
         (p.max_splits == 1 || (p.split_partial && p.split_max && p.split_denom && p.split_count)) &&
         p.num_heads % p.num_kv_heads == 0 && p.block_size > 0 && p.num_tokens <= 0x7fffffff &&
         attention::aligned16(p.k_cache) && attention::aligned16(p.v_cache);
}

// The kernel over the cache's type, then the merge of split queries.
template <int D>
cudaError_t launch(const PagedAttentionParams& p, dim3 grid, cudaStream_t stream) {
  if (p.kv_bf16)
    paged_attention_kernel<D, uint16_t><<<grid, attention::kThreads, 0, stream>>>(p);
  else
    paged_attention_kernel<D, float><<<grid, attention::kThreads, 0, stream>>>(p);
  if (cudaPeekAtLastError() != cudaSuccess) return cudaGetLastError();
  return attention::combine_splits<D>(p.out, p.ldo, p.num_tokens, p.num_heads, workspace(p), stream);
}

}  // namespace

cudaError_t paged_attention(const PagedAttentionParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return cudaSuccess;
  if (params.num_kv_heads <= 0 || !valid(params)) return cudaErrorInvalidValue;
  const int64_t group = params.num_heads / params.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(params.num_tokens), static_cast<unsigned>(params.num_kv_heads),
                  static_cast<unsigned>((group + kMaxGroup - 1) / kMaxGroup * params.max_splits));
  if (params.head_dim == 64) return launch<64>(params, grid, stream);
  return launch<128>(params, grid, stream);
}

}  // namespace ssd::kernels::cuda
