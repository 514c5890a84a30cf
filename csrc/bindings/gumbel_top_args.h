// Argument checks of torch.ops.ssd.gumbel_top shared by its CPU, Meta and CUDA
// glue (the rows as gumbel_sample's, plus the depth), and its kernel params.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "../kernels/cpu/gumbel.h"
#include "gumbel_sample_args.h"

namespace ssd::bindings {

/// The most a list may hold (the CUDA kernel's limit; the tree ranks a few dozen).
inline constexpr int64_t kGumbelTopMaxDepth = 512;

inline void check_gumbel_top_layout(const at::Tensor& probs, const at::Tensor& seeds, const at::Tensor& positions,
                                    int64_t depth) {
  check_gumbel_sample_layout(probs, seeds, positions, "gumbel_top");
  TORCH_CHECK(depth >= 0 && depth <= kGumbelTopMaxDepth, "gumbel_top: depth must be in [0, ",
              kGumbelTopMaxDepth, "], got ", depth);
}

/// Empty ids [N, depth] i64 and scores [N, depth] f64 on probs' device.
inline std::tuple<at::Tensor, at::Tensor> gumbel_top_outputs(const at::Tensor& probs, int64_t depth) {
  return {at::empty({probs.size(0), depth}, probs.options().dtype(at::kLong)),
          at::empty({probs.size(0), depth}, probs.options().dtype(at::kDouble))};
}

/// Kernel params over contiguous inputs (kept alive by the caller).
inline kernels::GumbelTopParams gumbel_top_params(const at::Tensor& probs, const at::Tensor& seeds,
                                                  const at::Tensor& positions, int64_t depth, at::Tensor& ids,
                                                  at::Tensor& scores) {
  kernels::GumbelTopParams p;
  p.probs = probs.data_ptr<float>();
  p.seeds = reinterpret_cast<const uint64_t*>(seeds.data_ptr<int64_t>());
  p.positions = positions.data_ptr<int64_t>();
  p.ids = ids.data_ptr<int64_t>();
  p.scores = scores.data_ptr<double>();
  p.rows = probs.size(0);
  p.vocab = probs.size(1);
  p.depth = depth;
  return p;
}

}  // namespace ssd::bindings
