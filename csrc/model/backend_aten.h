// The aten backend: every step as ATen ops on the backend's device. On the CPU
// each row goes through its own op calls (same shapes, so the same code path
// whatever the batch: ATen picks vectorized bodies, scalar tails and reduction
// splits by shape), which makes it batch-invariant by construction and slow;
// it is the second implementation of the interface, beside the cpu kernels.
// On CUDA the elementwise steps run over the whole batch (a CUDA elementwise
// kernel computes every element with the same code) and the cuda backend
// derives from it, replacing the steps that reduce. The aten backend itself on
// CUDA is a reference only: ATen's CUDA reductions may pick their order by a
// row's alignment, so it is not promised to be batch-invariant there.
#pragma once

#include "backend.h"

namespace ssd::model {

class AtenBackend : public Backend {
 public:
  explicit AtenBackend(at::Device device) : device_(device), row_by_row_(device.is_cpu()) {}

  std::string name() const override { return "aten"; }
  at::Device device() const override { return device_; }

  /// Stored in `dtype`, then kept as fp32 for the products (the values of a
  /// bf16 matrix are exactly representable in fp32).
  Matrix matrix(const at::Tensor& dense, at::ScalarType dtype) const override;
  at::Tensor embed(const at::Tensor& table, const DeviceBatch& b) const override;
  void rms_norm(const at::Tensor& x, const at::Tensor& w, float eps, const at::Tensor& out,
                StepContext& ctx) const override;
  at::Tensor linear(const at::Tensor& x, const Matrix& w, const at::Tensor& bias, StepContext& ctx) const override;
  void rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& inv_freq,
                     KvCache& cache, int64_t layer, const DeviceBatch& b, StepContext& ctx) const override;
  at::Tensor paged_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                             int64_t window, StepContext& ctx) const override;
  at::Tensor fork_attention(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                            int64_t window, StepContext& ctx) const override;
  at::Tensor silu_mul(const at::Tensor& gu) const override;
  void add(const at::Tensor& x, const at::Tensor& y) const override;
  void copy_kv_slots(KvCache& cache, const std::vector<int64_t>& src_slots,
                     const std::vector<int64_t>& dst_slots) const override;

 protected:
  /// Cache slot of every token of the batch, [T] int64, computed on the device.
  at::Tensor token_slots(const KvCache& cache, const DeviceBatch& b) const;
  /// Paged (and fork) attention row by row over ATen ops.
  at::Tensor attend_rows(const at::Tensor& q, KvCache& cache, int64_t layer, const DeviceBatch& b, float scale,
                         int64_t window) const;

  at::Device device_;
  bool row_by_row_;
};

std::unique_ptr<Backend> make_aten_backend(at::Device device);

}  // namespace ssd::model
