// What a round moves between the host and a model's device, one place for the
// target's round and the draft's sampling: per-row settings go up as small
// tensors (pinned and asynchronous on a GPU), and what comes back (counts,
// tokens, asked-for log-probabilities) is read through a HostReads, which
// counts its bytes for stats().
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "../model/backend.h"

namespace ssd::runtime {

/// values as a [n] tensor of `dtype` on the backend's device.
template <class T>
at::Tensor upload(const model::Backend& backend, const std::vector<T>& values, at::ScalarType dtype) {
  const bool cpu = backend.device().is_cpu();
  at::Tensor host =
      at::empty({static_cast<int64_t>(values.size())}, at::TensorOptions().dtype(dtype).pinned_memory(!cpu));
  std::copy(values.begin(), values.end(), static_cast<T*>(host.data_ptr()));
  return cpu ? host : host.to(backend.device(), dtype, /*non_blocking=*/true);
}

/// Device tensors read back to the host, their bytes counted (read by one
/// thread; bytes() from any, as stats() does).
class HostReads {
 public:
  at::Tensor read(const at::Tensor& t) {
    at::Tensor host = t.to(at::kCPU).contiguous();
    bytes_.fetch_add(static_cast<int64_t>(host.nbytes()), std::memory_order_relaxed);
    return host;
  }
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> bytes_{0};
};

}  // namespace ssd::runtime
