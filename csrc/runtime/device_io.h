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

/// Bytes of one row of a contiguous tensor [n, ...].
inline int64_t row_bytes(const at::Tensor& t) {
  return t.numel() == 0 ? 0 : static_cast<int64_t>(t.nbytes()) / t.size(0);
}

/// Rows `rows` of src [n, ...] (contiguous) as a new tensor on its device:
/// src itself when the rows are all of it in order, one index_select on a
/// device, plain copies on the CPU (whose ATen ops would wake their thread
/// pool beside the model's own).
inline at::Tensor select_rows(const model::Backend& backend, const at::Tensor& src, const std::vector<int64_t>& rows) {
  const auto n = static_cast<int64_t>(rows.size());
  bool all = n == src.size(0);
  for (int64_t i = 0; all && i < n; ++i) all = rows[i] == i;
  if (all) return src;
  if (!src.device().is_cpu()) return src.index_select(0, upload(backend, rows, at::kLong));
  const at::Tensor c = src.contiguous();
  std::vector<int64_t> sizes = c.sizes().vec();
  sizes[0] = n;
  at::Tensor out = at::empty(sizes, c.options());
  const int64_t bytes = row_bytes(c);
  const auto* from = static_cast<const char*>(c.data_ptr());
  auto* to = static_cast<char*>(out.data_ptr());
  for (int64_t i = 0; i < n; ++i) std::copy_n(from + rows[i] * bytes, bytes, to + i * bytes);
  return out;
}

/// dst[slots[i]] = src[i] for the rows of src [n, ...] (dst contiguous, on
/// src's device): one index_copy_ on a device, plain copies on the CPU.
inline void copy_rows(const model::Backend& backend, const at::Tensor& src, const at::Tensor& dst,
                      const std::vector<int64_t>& slots) {
  if (!dst.device().is_cpu()) {
    dst.index_copy_(0, upload(backend, slots, at::kLong), src);
    return;
  }
  const at::Tensor c = src.contiguous();
  const int64_t bytes = row_bytes(c);
  const auto* from = static_cast<const char*>(c.data_ptr());
  auto* to = static_cast<char*>(dst.data_ptr());
  for (size_t i = 0; i < slots.size(); ++i)
    std::copy_n(from + static_cast<int64_t>(i) * bytes, bytes, to + slots[i] * bytes);
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
