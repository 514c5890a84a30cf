// CPU and Meta glue of torch.ops.ssd.saguaro_sample (schema in ops.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/saguaro_sample.h"
#include "saguaro_sample_args.h"

namespace ssd::bindings {

namespace {

at::Tensor saguaro_sample_cpu(const at::Tensor& logits, const at::Tensor& temperature,
                              const at::Tensor& top_k, const at::Tensor& top_p,
                              const at::Tensor& fanout, const at::Tensor& downweight,
                              const at::Tensor& uniforms, at::Tensor& probs) {
  check_saguaro_sample_layout(logits, temperature, top_k, top_p, fanout, downweight, uniforms, probs);
  check_saguaro_sample_values(temperature, top_k, top_p, fanout, downweight, uniforms);
  const at::Tensor l = logits.contiguous(), t = temperature.contiguous(), k = top_k.contiguous(),
                   p = top_p.contiguous(), f = fanout.contiguous(), c = downweight.contiguous(),
                   u = uniforms.contiguous();
  at::Tensor tokens = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  kernels::saguaro_sample(saguaro_sample_params(l, t, k, p, f, c, u, probs, tokens));
  return tokens;
}

at::Tensor saguaro_sample_meta(const at::Tensor& logits, const at::Tensor& temperature,
                               const at::Tensor& top_k, const at::Tensor& top_p,
                               const at::Tensor& fanout, const at::Tensor& downweight,
                               const at::Tensor& uniforms, at::Tensor& probs) {
  check_saguaro_sample_layout(logits, temperature, top_k, top_p, fanout, downweight, uniforms, probs);
  return at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("saguaro_sample", &saguaro_sample_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("saguaro_sample", &saguaro_sample_meta); }

}  // namespace ssd::bindings
