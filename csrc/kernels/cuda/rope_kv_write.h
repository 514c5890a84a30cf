// CUDA rotary embedding and KV-cache write of the forward, in one kernel: the
// launcher of kernels/cuda/rope_kv_write.cu. Plain C++ (no torch).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// All pointers are device pointers. qkv [num_tokens, ld] holds each token's
/// fused row: num_heads q heads, then num_kv_heads k heads, then num_kv_heads
/// v heads, head_dim floats each. q and k are rotated in place (rotate-half,
/// angle = float(position) * inv_freq[i], as kernels/cpu/rope.cpp), then k and
/// v go to the slot block_tables[seq, pos / block_size] * block_size +
/// pos % block_size of k_cache / v_cache [blocks, block_size, num_kv_heads,
/// head_dim]. A token whose entry is -1 (padding, no block) is rotated and
/// writes nothing. Every element depends only on its own token:
/// batch-invariant. Indices are trusted (the forward checks them on the host).
struct RopeKvWriteParams {
  float* qkv = nullptr;
  int64_t ld = 0;
  int64_t num_tokens = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  const float* inv_freq = nullptr;  ///< [head_dim / 2]
  const int32_t* positions = nullptr;
  const int32_t* seq_of_token = nullptr;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  int64_t block_size = 0;
  float* k_cache = nullptr;  ///< fp32 cache, or null with k_cache_bf16 / v_cache_bf16
  float* v_cache = nullptr;
  uint16_t* k_cache_bf16 = nullptr;  ///< bf16 cache (bits): each value rounded to nearest even
  uint16_t* v_cache_bf16 = nullptr;
};

/// Enqueues the kernel on `stream`; cudaErrorInvalidValue for bad shapes.
cudaError_t rope_kv_write(const RopeKvWriteParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
