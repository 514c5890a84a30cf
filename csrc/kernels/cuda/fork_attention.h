// CUDA fork attention: the launcher of kernels/cuda/fork_attention.cu.
// Plain C++ (no torch), includable from host code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "paged_attention.h"

namespace ssd::kernels::cuda {

/// All pointers are device pointers. Layout as kernels/cpu/fork_attention.h:
/// paged attention's rows, tables, positions, window, cache (fp32 or bf16)
/// and split workspace, and per row the block table row it forks from
/// (prefix_seq) and where (prefix_len, 0..positions[t]): its keys below
/// prefix_len are read through that table, the others through its own.
/// Indices are trusted (not checked on the device).
struct ForkAttentionParams {
  PagedAttentionParams paged;
  const int32_t* prefix_seq = nullptr;  ///< [num_tokens]
  const int32_t* prefix_len = nullptr;  ///< [num_tokens]
};

/// Enqueues the kernel on `stream`; cudaErrorInvalidValue for unsupported
/// shapes or misaligned pointers, else the launch error.
cudaError_t fork_attention(const ForkAttentionParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
