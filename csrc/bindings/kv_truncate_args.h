// Argument checks and kernel parameters of kv_truncate, shared by its CPU,
// Meta and CUDA registrations (kv_truncate_cpu.cpp, kv_truncate_cuda.cpp).
#pragma once

#include <ATen/ATen.h>

#include "../kernels/cpu/kv_truncate.h"

namespace ssd::bindings {

inline void check_kv_truncate_tensor(const at::Tensor& t, const char* name, int64_t dim, at::ScalarType dtype,
                                     const at::Device& device) {
  TORCH_CHECK(t.dim() == dim && t.scalar_type() == dtype, "kv_truncate: ", name, " must be a ", dim, "-D ",
              dtype, " tensor, got ", t.scalar_type(), " ", t.sizes());
  TORCH_CHECK(t.device() == device, "kv_truncate: ", name, " is on ", t.device(), " but block_tables is on ",
              device);
}

/// Shapes, dtypes and devices; reads no data, so it is also the Meta kernel.
inline void check_kv_truncate(const at::Tensor& block_tables, const at::Tensor& seq_lens,
                              const at::Tensor& block_refcount, const at::Tensor& seq_ids,
                              const at::Tensor& new_lens, int64_t block_size) {
  const at::Device device = block_tables.device();
  check_kv_truncate_tensor(block_tables, "block_tables", 2, at::kInt, device);
  check_kv_truncate_tensor(seq_lens, "seq_lens", 1, at::kInt, device);
  check_kv_truncate_tensor(block_refcount, "block_refcount", 1, at::kInt, device);
  check_kv_truncate_tensor(seq_ids, "seq_ids", 1, at::kLong, device);
  check_kv_truncate_tensor(new_lens, "new_lens", 1, at::kLong, device);
  TORCH_CHECK(block_tables.is_contiguous() && seq_lens.is_contiguous() && block_refcount.is_contiguous(),
              "kv_truncate: block_tables, seq_lens and block_refcount are updated in place and must be "
              "contiguous");
  TORCH_CHECK(seq_lens.size(0) == block_tables.size(0), "kv_truncate: seq_lens has ", seq_lens.size(0),
              " entries but block_tables has ", block_tables.size(0), " rows");
  TORCH_CHECK(seq_ids.size(0) == new_lens.size(0), "kv_truncate: seq_ids has ", seq_ids.size(0),
              " entries but new_lens has ", new_lens.size(0));
  TORCH_CHECK_VALUE(block_size > 0, "kv_truncate: block_size must be > 0, got ", block_size);
}

/// Kernel parameters plus the tensors they point into (kept alive by this).
struct KvTruncateCall {
  at::Tensor seq_ids;
  at::Tensor new_lens;
  kernels::KvTruncateParams params;
};

inline KvTruncateCall prepare_kv_truncate(const at::Tensor& block_tables, const at::Tensor& seq_lens,
                                          const at::Tensor& block_refcount, const at::Tensor& seq_ids,
                                          const at::Tensor& new_lens, int64_t block_size) {
  check_kv_truncate(block_tables, seq_lens, block_refcount, seq_ids, new_lens, block_size);
  KvTruncateCall call{seq_ids.contiguous(), new_lens.contiguous(), {}};
  kernels::KvTruncateParams& p = call.params;
  p.block_tables = block_tables.data_ptr<int32_t>();
  p.seq_lens = seq_lens.data_ptr<int32_t>();
  p.block_refcount = block_refcount.data_ptr<int32_t>();
  p.num_seqs = block_tables.size(0);
  p.max_blocks = block_tables.size(1);
  p.num_blocks = block_refcount.size(0);
  p.seq_ids = call.seq_ids.const_data_ptr<int64_t>();
  p.new_lens = call.new_lens.const_data_ptr<int64_t>();
  p.n = call.seq_ids.size(0);
  p.block_size = block_size;
  return call;
}

inline void check_kv_truncate_status(const kernels::KvTruncateStatus& status) {
  TORCH_CHECK_VALUE(status.error == kernels::KvTruncateError::kNone, "kv_truncate: ",
                    kernels::describe(status));
}

}  // namespace ssd::bindings
