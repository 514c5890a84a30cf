// Argument checks of torch.ops.ssd.saguaro_sample shared by its CPU, Meta and
// CUDA glue, so every device rejects the same inputs with the same message.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "../kernels/cpu/saguaro_sample.h"

namespace ssd::bindings {

inline void check_row_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype,
                             const at::Tensor& logits) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == logits.size(0), "saguaro_sample: ", name,
              " must have shape [N] = [", logits.size(0), "], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, "saguaro_sample: ", name, " must be ", dtype, ", got ",
              t.scalar_type());
  TORCH_CHECK(t.device() == logits.device(), "saguaro_sample: ", name, " must be on ",
              logits.device(), " like logits, got ", t.device());
}

/// Shapes, dtypes and devices: everything a Meta tensor can be checked for.
inline void check_saguaro_sample_layout(const at::Tensor& logits, const at::Tensor& temperature,
                                        const at::Tensor& top_k, const at::Tensor& top_p,
                                        const at::Tensor& fanout, const at::Tensor& downweight,
                                        const at::Tensor& uniforms, const at::Tensor& probs) {
  TORCH_CHECK(logits.dim() == 2, "saguaro_sample: logits must have shape [N, V], got ", logits.sizes());
  TORCH_CHECK(logits.scalar_type() == at::kFloat, "saguaro_sample: logits must be float32, got ",
              logits.scalar_type());
  TORCH_CHECK(logits.size(1) >= 1 && logits.size(1) < (int64_t{1} << 31),
              "saguaro_sample: vocab size must be in [1, 2^31), got ", logits.size(1));
  check_row_tensor(temperature, "temperature", at::kDouble, logits);
  check_row_tensor(top_k, "top_k", at::kLong, logits);
  check_row_tensor(top_p, "top_p", at::kDouble, logits);
  check_row_tensor(fanout, "fanout", at::kLong, logits);
  check_row_tensor(downweight, "downweight", at::kDouble, logits);
  check_row_tensor(uniforms, "uniforms", at::kDouble, logits);
  TORCH_CHECK(probs.sizes() == logits.sizes(), "saguaro_sample: probs must have the shape of logits ",
              logits.sizes(), ", got ", probs.sizes());
  TORCH_CHECK(probs.scalar_type() == at::kFloat, "saguaro_sample: probs must be float32, got ",
              probs.scalar_type());
  TORCH_CHECK(probs.device() == logits.device(), "saguaro_sample: probs must be on ", logits.device(),
              " like logits, got ", probs.device());
  TORCH_CHECK(probs.is_contiguous(), "saguaro_sample: probs must be contiguous (it is written in place)");
}

/// Per-row settings in range. One host sync for the common all-valid case.
inline void check_saguaro_sample_values(const at::Tensor& temperature, const at::Tensor& top_k,
                                        const at::Tensor& top_p, const at::Tensor& fanout,
                                        const at::Tensor& downweight, const at::Tensor& uniforms) {
  struct Rule {
    const at::Tensor& values;
    at::Tensor ok;
    std::string what;
  };
  const std::vector<Rule> rules = {
      {temperature, temperature.ge(0) & temperature.isfinite(), "temperature must be finite and >= 0"},
      {top_k, top_k.ge(0), "top_k must be >= 0 (0: off)"},
      {top_p, top_p.gt(0) & top_p.le(1), "top_p must be in (0, 1]"},
      {fanout, fanout.ge(0), "fanout must be >= 0"},
      {downweight, downweight.ge(0) & downweight.le(1), "downweight must be in [0, 1]"},
      {uniforms, uniforms.ge(0) & uniforms.lt(1), "uniforms must be in [0, 1)"},
  };
  std::vector<at::Tensor> all_ok;
  for (const Rule& r : rules) all_ok.push_back(r.ok.all());
  if (at::stack(all_ok).all().item<bool>()) return;
  for (const Rule& r : rules) {
    if (r.ok.all().item<bool>()) continue;
    const int64_t row = r.ok.logical_not().nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, "saguaro_sample: ", r.what, "; row ", row, " has ", r.values[row].item<double>());
  }
}

/// Kernel params over contiguous inputs (kept alive by the caller).
inline kernels::SaguaroSampleParams saguaro_sample_params(
    const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
    const at::Tensor& top_p, const at::Tensor& fanout, const at::Tensor& downweight,
    const at::Tensor& uniforms, at::Tensor& probs, at::Tensor& tokens) {
  kernels::SaguaroSampleParams p;
  p.logits = logits.data_ptr<float>();
  p.rows = logits.size(0);
  p.vocab = logits.size(1);
  p.temperature = temperature.data_ptr<double>();
  p.top_k = top_k.data_ptr<int64_t>();
  p.top_p = top_p.data_ptr<double>();
  p.fanout = fanout.data_ptr<int64_t>();
  p.downweight = downweight.data_ptr<double>();
  p.uniforms = uniforms.data_ptr<double>();
  p.probs = probs.data_ptr<float>();
  p.tokens = tokens.data_ptr<int64_t>();
  return p;
}

}  // namespace ssd::bindings
