// Lossless speculative verification on NVIDIA GPUs: the same contract as
// kernels/cpu/verify.h, which is its oracle.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace ssd::kernels::cuda {

/// Device buffers, row-major and contiguous, shaped as in kernels/cpu/verify.h:
/// target_logits [B, K + 1, V]; proposals [B, K]; num_proposals [B]; q_probs [B, K, V];
/// one_hot, temperature, top_k, top_p [B]; accept_uniforms [B, K]; bonus_uniforms [B];
/// accepted, bonus [B] (written); workspace of verify_workspace_bytes(B, K) bytes.
struct VerifyParams {
  const float* target_logits = nullptr;
  const int64_t* proposals = nullptr;
  const int64_t* num_proposals = nullptr;
  const float* q_probs = nullptr;
  const bool* one_hot = nullptr;
  const double* temperature = nullptr;
  const int64_t* top_k = nullptr;
  const double* top_p = nullptr;
  const double* accept_uniforms = nullptr;
  const double* bonus_uniforms = nullptr;
  int64_t* accepted = nullptr;
  int64_t* bonus = nullptr;
  void* workspace = nullptr;
  int64_t batch = 0;
  int64_t k = 0;
  int64_t vocab = 0;
};

/// Scratch the launcher needs: one summary of the processed distribution per (row, position).
size_t verify_workspace_bytes(int64_t batch, int64_t k);

/// Enqueues verification of every row on `stream`. num_proposals outside
/// [0, K] is clamped and a proposal outside the vocabulary is rejected (the
/// CPU glue reports both as errors instead).
cudaError_t verify(const VerifyParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
