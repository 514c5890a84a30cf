// kv_truncate on the CPU (and its Meta kernel for fake tensors).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kv_truncate_args.h"

namespace ssd::bindings {
namespace {

void kv_truncate_cpu(at::Tensor& block_tables, at::Tensor& seq_lens, at::Tensor& block_refcount,
                     const at::Tensor& seq_ids, const at::Tensor& new_lens, int64_t block_size) {
  const KvTruncateCall call =
      prepare_kv_truncate(block_tables, seq_lens, block_refcount, seq_ids, new_lens, block_size);
  check_kv_truncate_status(kernels::kv_truncate(call.params));
}

void kv_truncate_meta(at::Tensor& block_tables, at::Tensor& seq_lens, at::Tensor& block_refcount,
                      const at::Tensor& seq_ids, const at::Tensor& new_lens, int64_t block_size) {
  check_kv_truncate(block_tables, seq_lens, block_refcount, seq_ids, new_lens, block_size);
}

}  // namespace
}  // namespace ssd::bindings

TORCH_LIBRARY_IMPL(ssd, CPU, m) { m.impl("kv_truncate", &ssd::bindings::kv_truncate_cpu); }

TORCH_LIBRARY_IMPL(ssd, Meta, m) { m.impl("kv_truncate", &ssd::bindings::kv_truncate_meta); }
