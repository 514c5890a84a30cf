// CPU and Meta glue of torch.ops.ssd.gumbel_sample (schema in ops.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/gumbel.h"
#include "gumbel_sample_args.h"

namespace ssd::bindings {

namespace {

at::Tensor gumbel_sample_cpu(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions) {
  check_gumbel_sample_layout(probs, seeds, positions);
  check_gumbel_sample_values(probs, positions);
  const at::Tensor p = probs.contiguous(), s = seeds.contiguous(), q = positions.contiguous();
  at::Tensor tokens = at::empty({probs.size(0)}, probs.options().dtype(at::kLong));
  kernels::gumbel_sample(gumbel_sample_params(p, s, q, tokens));
  return tokens;
}

at::Tensor gumbel_sample_meta(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions) {
  check_gumbel_sample_layout(probs, seeds, positions);
  return at::empty({probs.size(0)}, probs.options().dtype(at::kLong));
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("gumbel_sample", &gumbel_sample_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("gumbel_sample", &gumbel_sample_meta); }

}  // namespace ssd::bindings
