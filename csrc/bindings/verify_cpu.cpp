// CPU and Meta implementations of ssd::verify (schema in ops.cpp).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "../kernels/cpu/verify.h"
#include "verify_checks.h"

namespace ssd {
namespace {

// Values the kernel indexes with or relies on; the CUDA path skips these
// checks because reading device values would synchronise the stream.
void check_verify_values(const VerifyDims& d, const at::Tensor& proposals,
                         const at::Tensor& num_proposals, const at::Tensor& temperature,
                         const at::Tensor& top_k, const at::Tensor& top_p) {
  const auto* x = proposals.data_ptr<int64_t>();
  const auto* n = num_proposals.data_ptr<int64_t>();
  const auto* t = temperature.data_ptr<double>();
  const auto* tk = top_k.data_ptr<int64_t>();
  const auto* tp = top_p.data_ptr<double>();
  for (int64_t b = 0; b < d.batch; ++b) {
    TORCH_CHECK(n[b] >= 0 && n[b] <= d.k, "verify: num_proposals[", b, "] = ", n[b],
                " is outside [0, ", d.k, "]");
    TORCH_CHECK(std::isfinite(t[b]) && t[b] >= 0.0, "verify: temperature[", b, "] = ", t[b],
                " must be finite and >= 0");
    TORCH_CHECK(tk[b] >= 0, "verify: top_k[", b, "] = ", tk[b], " must be >= 0 (0: off)");
    TORCH_CHECK(tp[b] > 0.0 && tp[b] <= 1.0, "verify: top_p[", b, "] = ", tp[b],
                " must be in (0, 1]");
    for (int64_t i = 0; i < n[b]; ++i) {
      const int64_t xi = x[b * d.k + i];
      TORCH_CHECK(xi >= 0 && xi < d.vocab, "verify: proposals[", b, ", ", i, "] = ", xi,
                  " is outside the vocabulary [0, ", d.vocab, ")");
    }
  }
}

std::tuple<at::Tensor, at::Tensor> verify_cpu(
    const at::Tensor& target_logits, const at::Tensor& proposals, const at::Tensor& num_proposals,
    const at::Tensor& q_probs, const at::Tensor& one_hot, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& accept_uniforms,
    const at::Tensor& bonus_uniforms) {
  const VerifyDims d = check_verify_args(target_logits, proposals, num_proposals, q_probs, one_hot,
                                         temperature, top_k, top_p, accept_uniforms,
                                         bonus_uniforms);
  const VerifyInputs in = contiguous_verify_inputs(target_logits, proposals, num_proposals, q_probs,
                                                   one_hot, temperature, top_k, top_p,
                                                   accept_uniforms, bonus_uniforms);
  check_verify_values(d, in.proposals, in.num_proposals, in.temperature, in.top_k, in.top_p);
  at::Tensor accepted = at::empty({d.batch}, proposals.options());
  at::Tensor bonus = at::empty({d.batch}, proposals.options());
  const kernels::VerifyParams p = verify_params(d, in, accepted, bonus);
  // A row costs up to (K + 1) softmaxes over V: aim for ~64k logits per task.
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / ((d.k + 1) * d.vocab));
  at::parallel_for(0, d.batch, grain, [&](int64_t begin, int64_t end) { kernels::verify(p, begin, end); });
  return {accepted, bonus};
}

std::tuple<at::Tensor, at::Tensor> verify_meta(
    const at::Tensor& target_logits, const at::Tensor& proposals, const at::Tensor& num_proposals,
    const at::Tensor& q_probs, const at::Tensor& one_hot, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& accept_uniforms,
    const at::Tensor& bonus_uniforms) {
  const VerifyDims d = check_verify_args(target_logits, proposals, num_proposals, q_probs, one_hot,
                                         temperature, top_k, top_p, accept_uniforms,
                                         bonus_uniforms);
  return {at::empty({d.batch}, proposals.options()), at::empty({d.batch}, proposals.options())};
}

}  // namespace
}  // namespace ssd

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("verify", &ssd::verify_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("verify", &ssd::verify_meta); }
