// kv_commit on the CPU (and its Meta kernel for fake tensors).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kv_commit_args.h"

namespace ssd::bindings {
namespace {

void kv_commit_cpu(at::Tensor& cache, const at::Tensor& tree, const at::Tensor& src_slots,
                   const at::Tensor& dst_slots) {
  const KvCommitCall call = prepare_kv_commit(cache, tree, src_slots, dst_slots);
  check_kv_commit_status(kernels::kv_commit(call.params));
}

void kv_commit_meta(at::Tensor& cache, const at::Tensor& tree, const at::Tensor& src_slots,
                    const at::Tensor& dst_slots) {
  check_kv_commit(cache, tree, src_slots, dst_slots);
}

}  // namespace
}  // namespace ssd::bindings

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("kv_commit", &ssd::bindings::kv_commit_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("kv_commit", &ssd::bindings::kv_commit_meta); }
