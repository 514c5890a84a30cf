// kv_truncate on NVIDIA GPUs: the launcher behind bindings/kv_truncate_cuda.cpp.
// The semantics, checks and error codes are those of kernels/cpu/kv_truncate.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../cpu/kv_truncate.h"

namespace ssd::kernels::cuda {

struct KvTruncateParams {
  ::ssd::kernels::KvTruncateParams table;  ///< every pointer on the device
  /// [4] on the device, always written: error, item, value, detail of a
  /// KvTruncateStatus. Nothing else changes unless the error is kNone.
  int64_t* status = nullptr;
};

/// Enqueues the truncation on `stream`; the status is ready when the stream
/// reaches it. Returns a launch error, never throws. Kept for the GPU tree;
/// the runtime does not call it yet.
cudaError_t kv_truncate(const KvTruncateParams& params, cudaStream_t stream);

}  // namespace ssd::kernels::cuda
