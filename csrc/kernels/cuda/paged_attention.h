// CUDA paged attention: the launcher of kernels/cuda/paged_attention.cu.
// Plain C++ (no torch), includable from host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// All pointers are device pointers. Layout as kernels/cpu/paged_attention.h:
/// q, out [num_tokens, ld] with num_heads * head_dim used; k_cache, v_cache
/// [blocks, block_size, num_kv_heads, head_dim] contiguous, fp32 or (kv_bf16)
/// bf16 read as fp32; block_tables
/// [num_seqs, max_blocks]; query t attends to positions 0..positions[t] of
/// sequence seq_of_token[t], or with window > 0 to positions
/// positions[t] - window + 1..positions[t]. A query whose own entry is -1
/// (padding, no block) attends to nothing: its output is 0. Indices are
/// trusted (not checked on the device).
struct PagedAttentionParams {
  const float* q = nullptr;
  int64_t ldq = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  const void* k_cache = nullptr;  ///< fp32, or bf16 bits with kv_bf16
  const void* v_cache = nullptr;
  bool kv_bf16 = false;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  ///< 64 or 128
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;
  int64_t max_blocks = 0;
  const int32_t* seq_of_token = nullptr;
  const int32_t* positions = nullptr;
  float scale = 1.0f;
  /// A query's keys are attended in splits of kSplitKeys (256) at fixed key
  /// indices (kernels/key_splits.h), the CPU kernels' splits. max_splits: at
  /// least the most splits any query spans; above 1 the split_* buffers
  /// ([num_tokens, max_splits, num_heads] rows; split_partial head_dim floats a
  /// row, split_count [num_tokens]) hold the partial results a second kernel
  /// combines. With max_splits 1 every query must lie in one split.
  int64_t max_splits = 1;
  float* split_partial = nullptr;
  float* split_max = nullptr;
  float* split_denom = nullptr;
  int32_t* split_count = nullptr;
  int64_t window = 0;
};

/// Enqueues the kernel on `stream`; cudaErrorInvalidValue for unsupported
/// shapes or misaligned pointers, else the launch error.
cudaError_t paged_attention(const PagedAttentionParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
