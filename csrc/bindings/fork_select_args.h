// Argument checks of torch.ops.ssd.fork_select shared by its CPU, Meta and
// CUDA glue, so every device rejects the same inputs with the same message.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "../kernels/cpu/fork_select.h"

namespace ssd::bindings {

/// Shapes, dtypes and devices: everything a Meta tensor can be checked for.
inline void check_fork_select_layout(const at::Tensor& probs, const at::Tensor& drafted,
                                     const at::Tensor& fanout, int64_t max_fanout) {
  TORCH_CHECK(probs.dim() == 3 && probs.size(1) >= 1,
              "fork_select: probs must have shape [B, K+1, V], got ", probs.sizes());
  TORCH_CHECK(probs.scalar_type() == at::kFloat, "fork_select: probs must be float32, got ",
              probs.scalar_type());
  TORCH_CHECK(probs.size(2) >= 1 && probs.size(2) < (int64_t{1} << 31),
              "fork_select: vocab size must be in [1, 2^31), got ", probs.size(2));
  const int64_t b = probs.size(0), k = probs.size(1) - 1;
  TORCH_CHECK(drafted.dim() == 2 && drafted.size(0) == b && drafted.size(1) == k,
              "fork_select: drafted must have shape [B, K] = [", b, ", ", k, "], got ", drafted.sizes());
  TORCH_CHECK(drafted.scalar_type() == at::kLong, "fork_select: drafted must be int64, got ",
              drafted.scalar_type());
  TORCH_CHECK(fanout.dim() == 1 && fanout.size(0) == k + 1,
              "fork_select: fanout must have shape [K+1] = [", k + 1, "], got ", fanout.sizes());
  TORCH_CHECK(fanout.scalar_type() == at::kLong, "fork_select: fanout must be int64, got ",
              fanout.scalar_type());
  TORCH_CHECK(drafted.device() == probs.device() && fanout.device() == probs.device(),
              "fork_select: drafted and fanout must be on ", probs.device(), " like probs, got ",
              drafted.device(), " and ", fanout.device());
  TORCH_CHECK(max_fanout >= 0, "fork_select: max_fanout must be >= 0, got ", max_fanout);
}

/// fanout in [0, max_fanout], drafted tokens inside the vocabulary. One host
/// sync for the common all-valid case.
inline void check_fork_select_values(const at::Tensor& probs, const at::Tensor& drafted,
                                     const at::Tensor& fanout, int64_t max_fanout) {
  const at::Tensor fanout_ok = fanout.ge(0) & fanout.le(max_fanout);
  const at::Tensor drafted_ok = drafted.ge(0) & drafted.lt(probs.size(2));
  if (at::stack({fanout_ok.all(), drafted_ok.all()}).all().item<bool>()) return;
  if (!fanout_ok.all().item<bool>()) {
    const int64_t j = fanout_ok.logical_not().nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "fork_select: fanout must be in [0, max_fanout = ", max_fanout, "]; fanout[", j,
                "] = ", fanout[j].item<int64_t>());
  }
  const at::Tensor bad = drafted_ok.logical_not().nonzero()[0];
  const int64_t b = bad[0].item<int64_t>(), j = bad[1].item<int64_t>();
  TORCH_CHECK(false, "fork_select: drafted tokens must be in [0, V = ", probs.size(2), "); drafted[", b,
              ", ", j, "] = ", drafted[b][j].item<int64_t>());
}

/// Empty candidates [B, K+1, max_fanout] and counts [B, K+1] int64 on probs' device.
inline std::tuple<at::Tensor, at::Tensor> fork_select_outputs(const at::Tensor& probs, int64_t max_fanout) {
  const auto options = probs.options().dtype(at::kLong);
  return {at::empty({probs.size(0), probs.size(1), max_fanout}, options),
          at::empty({probs.size(0), probs.size(1)}, options)};
}

/// Kernel params over contiguous inputs (kept alive by the caller).
inline kernels::ForkSelectParams fork_select_params(const at::Tensor& probs, const at::Tensor& drafted,
                                                    const at::Tensor& fanout, int64_t max_fanout,
                                                    at::Tensor& candidates, at::Tensor& counts) {
  kernels::ForkSelectParams p;
  p.probs = probs.data_ptr<float>();
  p.drafted = drafted.data_ptr<int64_t>();
  p.fanout = fanout.data_ptr<int64_t>();
  p.batch = probs.size(0);
  p.positions = probs.size(1);
  p.vocab = probs.size(2);
  p.max_fanout = max_fanout;
  p.candidates = candidates.data_ptr<int64_t>();
  p.counts = counts.data_ptr<int64_t>();
  return p;
}

}  // namespace ssd::bindings
