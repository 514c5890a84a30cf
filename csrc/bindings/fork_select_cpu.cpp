// CPU and Meta glue of torch.ops.ssd.fork_select (schema in ops.cpp).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../kernels/cpu/fork_select.h"
#include "fork_select_args.h"

namespace ssd::bindings {

namespace {

std::tuple<at::Tensor, at::Tensor> fork_select_cpu(const at::Tensor& probs, const at::Tensor& drafted,
                                                   const at::Tensor& fanout, int64_t max_fanout) {
  check_fork_select_layout(probs, drafted, fanout, max_fanout);
  check_fork_select_values(probs, drafted, fanout, max_fanout);
  const at::Tensor p = probs.contiguous(), d = drafted.contiguous(), f = fanout.contiguous();
  auto [candidates, counts] = fork_select_outputs(probs, max_fanout);
  kernels::fork_select(fork_select_params(p, d, f, max_fanout, candidates, counts));
  return {candidates, counts};
}

std::tuple<at::Tensor, at::Tensor> fork_select_meta(const at::Tensor& probs, const at::Tensor& drafted,
                                                    const at::Tensor& fanout, int64_t max_fanout) {
  check_fork_select_layout(probs, drafted, fanout, max_fanout);
  return fork_select_outputs(probs, max_fanout);
}

}  // namespace

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("fork_select", &fork_select_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("fork_select", &fork_select_meta); }

}  // namespace ssd::bindings
