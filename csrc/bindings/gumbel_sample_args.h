// Argument checks of torch.ops.ssd.gumbel_sample (and of gumbel_top, which
// takes the same rows) shared by its CPU, Meta and CUDA glue, so every device
// rejects the same inputs with the same message.
#pragma once

#include <ATen/ATen.h>

#include "../kernels/cpu/gumbel.h"

namespace ssd::bindings {

inline void check_gumbel_row_tensor(const at::Tensor& t, const char* name, const at::Tensor& probs,
                                    const char* op) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == probs.size(0), op, ": ", name, " must have shape [N] = [",
              probs.size(0), "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kLong, op, ": ", name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.device() == probs.device(), op, ": ", name, " must be on ", probs.device(),
              " like probs, got ", t.device());
}

/// Shapes, dtypes and devices: everything a Meta tensor can be checked for.
inline void check_gumbel_sample_layout(const at::Tensor& probs, const at::Tensor& seeds,
                                       const at::Tensor& positions, const char* op = "gumbel_sample") {
  TORCH_CHECK(probs.dim() == 2, op, ": probs must have shape [N, V], got ", probs.sizes());
  TORCH_CHECK(probs.scalar_type() == at::kFloat, op, ": probs must be float32, got ", probs.scalar_type());
  TORCH_CHECK(probs.size(1) >= 1 && probs.size(1) < (int64_t{1} << 31), op,
              ": vocab size must be in [1, 2^31), got ", probs.size(1));
  check_gumbel_row_tensor(seeds, "seeds", probs, op);
  check_gumbel_row_tensor(positions, "positions", probs, op);
}

/// Positions >= 0 and probs finite and >= 0 (any seed bits are valid). One
/// host sync for the common all-valid case; otherwise the first offending row.
inline void check_gumbel_sample_values(const at::Tensor& probs, const at::Tensor& positions,
                                       const char* op = "gumbel_sample") {
  const at::Tensor positions_ok = positions.ge(0);
  const at::Tensor probs_ok = probs.isfinite() & probs.ge(0);
  if (at::stack({positions_ok.all(), probs_ok.all()}).all().item<bool>()) return;
  if (!positions_ok.all().item<bool>()) {
    const int64_t row = positions_ok.logical_not().nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, op, ": positions must be >= 0; row ", row, " has ",
                positions[row].item<int64_t>());
  }
  const at::Tensor bad = probs_ok.logical_not().nonzero()[0];  // [row, token]
  const int64_t row = bad[0].item<int64_t>(), token = bad[1].item<int64_t>();
  TORCH_CHECK(false, op, ": probs must be finite and >= 0; row ", row, " has ",
              probs[row][token].item<double>(), " at token ", token);
}

/// Kernel params over contiguous inputs (kept alive by the caller). seeds
/// hold the uint64 seeds' bit patterns.
inline kernels::GumbelSampleParams gumbel_sample_params(const at::Tensor& probs, const at::Tensor& seeds,
                                                        const at::Tensor& positions, at::Tensor& tokens) {
  kernels::GumbelSampleParams p;
  p.probs = probs.data_ptr<float>();
  p.seeds = reinterpret_cast<const uint64_t*>(seeds.data_ptr<int64_t>());
  p.positions = positions.data_ptr<int64_t>();
  p.tokens = tokens.data_ptr<int64_t>();
  p.rows = probs.size(0);
  p.vocab = probs.size(1);
  return p;
}

}  // namespace ssd::bindings
