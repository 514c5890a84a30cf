// kv_commit on NVIDIA GPUs: the launcher behind bindings/kv_commit_cuda.cpp.
// The semantics, checks and error codes are those of kernels/cpu/kv_commit.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../cpu/kv_commit.h"

namespace ssd::kernels::cuda {

struct KvCommitParams {
  ::ssd::kernels::KvCommitParams copy;  ///< every pointer on the device
  /// [num_layers, 2, n, row] on the device, required when copy.tree_in_cache:
  /// all source rows are gathered here before any destination row is written.
  void* staging = nullptr;
  /// [4] on the device, always written: error, item, value, detail of a
  /// KvCommitStatus. Rows are copied only when the error is kNone.
  int64_t* status = nullptr;
};

/// Enqueues validation and copy on `stream`; the status is ready when the
/// stream reaches it. Returns a launch error, never throws.
cudaError_t kv_commit(const KvCommitParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
