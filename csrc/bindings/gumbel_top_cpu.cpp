// CPU and Meta glue of torch.ops.ssd.gumbel_top (schema in ops.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/gumbel.h"
#include "gumbel_top_args.h"

namespace ssd::bindings {

namespace {

std::tuple<at::Tensor, at::Tensor> gumbel_top_cpu(const at::Tensor& probs, const at::Tensor& seeds,
                                                  const at::Tensor& positions, int64_t depth) {
  check_gumbel_top_layout(probs, seeds, positions, depth);
  check_gumbel_sample_values(probs, positions, "gumbel_top");
  const at::Tensor p = probs.contiguous(), s = seeds.contiguous(), q = positions.contiguous();
  auto [ids, scores] = gumbel_top_outputs(probs, depth);
  kernels::gumbel_top(gumbel_top_params(p, s, q, depth, ids, scores));
  return {ids, scores};
}

std::tuple<at::Tensor, at::Tensor> gumbel_top_meta(const at::Tensor& probs, const at::Tensor& seeds,
                                                   const at::Tensor& positions, int64_t depth) {
  check_gumbel_top_layout(probs, seeds, positions, depth);
  return gumbel_top_outputs(probs, depth);
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("gumbel_top", &gumbel_top_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("gumbel_top", &gumbel_top_meta); }

}  // namespace ssd::bindings
