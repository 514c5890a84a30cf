// CUDA fork attention: the launcher of kernels/cuda/fork_attention.cu.
// Plain C++ (no torch), includable from host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssd::kernels::cuda {

/// All pointers are device pointers. Layout as kernels/cpu/fork_attention.h:
/// branch n attends to positions 0..prefix_len[n]-1 of sequence branch_seq[n]
/// in the paged cache, then to its path slots 0..path_len[n]-1 of path_k /
/// path_v [num_branches, max_path, num_kv_heads, head_dim]. Indices are
/// trusted (not checked on the device).
struct ForkAttentionParams {
  const float* q = nullptr;  ///< [num_branches, ldq]
  int64_t ldq = 0;
  float* out = nullptr;  ///< [num_branches, ldo]
  int64_t ldo = 0;
  const float* k_cache = nullptr;  ///< [blocks, block_size, num_kv_heads, head_dim]
  const float* v_cache = nullptr;
  int64_t num_branches = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  ///< 64 or 128
  int64_t block_size = 0;
  const int32_t* block_tables = nullptr;  ///< [num_seqs, max_blocks]
  int64_t max_blocks = 0;
  const int32_t* branch_seq = nullptr;
  const int32_t* prefix_len = nullptr;
  const float* path_k = nullptr;
  const float* path_v = nullptr;
  int64_t max_path = 0;
  const int32_t* path_len = nullptr;
  float scale = 1.0f;
  /// A query's keys are attended in splits of kSplitKeys (256) at fixed key
  /// indices (kernels/key_splits.h), the CPU kernels' splits. max_splits: at
  /// least the most splits any query spans; above 1 the split_* buffers
  /// ([num_branches, max_splits, num_heads] rows; split_partial head_dim floats a
  /// row, split_count [num_branches]) hold the partial results a second kernel
  /// combines. With max_splits 1 every query must lie in one split.
  int64_t max_splits = 1;
  float* split_partial = nullptr;
  float* split_max = nullptr;
  float* split_denom = nullptr;
  int32_t* split_count = nullptr;
};

/// Enqueues the kernel on `stream`; cudaErrorInvalidValue for unsupported
/// shapes or misaligned pointers, else the launch error. Kept for the GPU
/// tree; the runtime does not call it yet.
cudaError_t fork_attention(const ForkAttentionParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
