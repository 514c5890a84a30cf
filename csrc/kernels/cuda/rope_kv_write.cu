// One block per token: rotate its q and k heads in place, then copy its k and
// v heads to the token's cache slot (a padding token, entry -1, copies
// nothing). The rotation spells out the CPU's operations (a * c - b * s and
// b * c + a * s, each product and sum rounded on its own, never fused), with
// cosf / sinf for the CPU's std::cos / std::sin.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "rope_kv_write.h"

namespace ssd::kernels::cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) rope_kv_write_kernel(RopeKvWriteParams p) {
  const int64_t t = blockIdx.x;
  const int64_t half = p.head_dim / 2;
  float* row = p.qkv + t * p.ld;
  const float pos = static_cast<float>(p.positions[t]);
  const int64_t pairs = (p.num_heads + p.num_kv_heads) * half;  // q heads, then k heads
  for (int64_t j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int64_t head = j / half, i = j % half;
    float* x = row + head * p.head_dim;
    const float angle = __fmul_rn(pos, p.inv_freq[i]);
    const float c = cosf(angle), s = sinf(angle);
    const float a = x[i], b = x[i + half];
    x[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
  }
  __syncthreads();  // the rotated k is read below by other threads
  const int64_t kv_width = p.num_kv_heads * p.head_dim;
  const int64_t position = p.positions[t];
  const int64_t block = p.block_tables[p.seq_of_token[t] * p.max_blocks + position / p.block_size];
  if (block < 0) return;  // padding (-1, no block): q and k rotated, nothing written
  const int64_t slot = block * p.block_size + position % p.block_size;
  const float* k = row + p.num_heads * p.head_dim;
  const float* v = k + kv_width;
  if (p.k_cache_bf16 != nullptr) {
    for (int64_t j = threadIdx.x; j < kv_width; j += blockDim.x) {
      p.k_cache_bf16[slot * kv_width + j] = __bfloat16_as_ushort(__float2bfloat16_rn(k[j]));
      p.v_cache_bf16[slot * kv_width + j] = __bfloat16_as_ushort(__float2bfloat16_rn(v[j]));
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < kv_width; j += blockDim.x) {
    p.k_cache[slot * kv_width + j] = k[j];
    p.v_cache[slot * kv_width + j] = v[j];
  }
}

}  // namespace

cudaError_t rope_kv_write(const RopeKvWriteParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_tokens > 0x7fffffff || p.head_dim <= 0 || p.head_dim % 2 != 0 ||
      p.num_heads <= 0 || p.num_kv_heads <= 0 || p.block_size <= 0 || p.max_blocks <= 0 ||
      p.ld < (p.num_heads + 2 * p.num_kv_heads) * p.head_dim ||
      (p.k_cache_bf16 != nullptr) != (p.v_cache_bf16 != nullptr) ||
      (p.k_cache == nullptr) == (p.k_cache_bf16 == nullptr))
    return cudaErrorInvalidValue;
  if (p.num_tokens == 0) return cudaSuccess;
  rope_kv_write_kernel<<<static_cast<unsigned>(p.num_tokens), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace ssd::kernels::cuda
