// Argument checks and kernel parameters of kv_commit, shared by its CPU,
// Meta and CUDA registrations (kv_commit_cpu.cpp, kv_commit_cuda.cpp).
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <utility>

#include "../kernels/cpu/kv_commit.h"

namespace ssd::bindings {

/// True when each [kv_heads, head_dim] row of t is one contiguous run.
inline bool kv_rows_dense(const at::Tensor& t) {
  return (t.size(4) == 1 || t.stride(4) == 1) && (t.size(3) == 1 || t.stride(3) == t.size(4));
}

inline void check_kv_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 5 && t.size(1) == 2, "kv_commit: ", name,
              " must be [layers, 2, slots, kv_heads, head_dim], got ", t.sizes());
  const auto dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, "kv_commit: ", name,
              " must be float32, bfloat16 or float16, got ", dtype);
}

/// Shapes, dtypes and devices; reads no data, so it is also the Meta kernel.
inline void check_kv_commit(const at::Tensor& cache, const at::Tensor& tree, const at::Tensor& src_slots,
                            const at::Tensor& dst_slots) {
  check_kv_tensor(cache, "cache");
  check_kv_tensor(tree, "tree");
  TORCH_CHECK(tree.scalar_type() == cache.scalar_type(), "kv_commit: tree is ", tree.scalar_type(),
              " but cache is ", cache.scalar_type());
  TORCH_CHECK(tree.size(0) == cache.size(0) && tree.size(3) == cache.size(3) && tree.size(4) == cache.size(4),
              "kv_commit: tree ", tree.sizes(), " and cache ", cache.sizes(),
              " must agree in layers, kv_heads and head_dim");
  TORCH_CHECK(kv_rows_dense(cache), "kv_commit: cache is written in place, so its [kv_heads, head_dim] rows ",
              "must be contiguous; got strides ", cache.strides());
  TORCH_CHECK(at::has_internal_overlap(cache) != at::MemOverlap::Yes,
              "kv_commit: cache must not overlap itself (it is written in place)");
  for (const auto& [t, name] : {std::pair{&src_slots, "src_slots"}, std::pair{&dst_slots, "dst_slots"}}) {
    TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kLong, "kv_commit: ", name,
                " must be a 1-D int64 tensor, got ", t->scalar_type(), " ", t->sizes());
    TORCH_CHECK(t->device() == cache.device(), "kv_commit: ", name, " is on ", t->device(),
                " but cache is on ", cache.device());
  }
  TORCH_CHECK(tree.device() == cache.device(), "kv_commit: tree is on ", tree.device(), " but cache is on ",
              cache.device());
  TORCH_CHECK(src_slots.size(0) == dst_slots.size(0), "kv_commit: src_slots has ", src_slots.size(0),
              " entries but dst_slots has ", dst_slots.size(0));
}

/// Kernel parameters plus the tensors they point into (kept alive by this).
struct KvCommitCall {
  at::Tensor tree;
  at::Tensor src_slots;
  at::Tensor dst_slots;
  kernels::KvCommitParams params;
};

inline kernels::KvRows kv_rows_of(const at::Tensor& t) {
  const int64_t elem = t.element_size();
  return {t.stride(0) * elem, t.stride(1) * elem, t.stride(2) * elem, t.size(2)};
}

/// The slot offset of tree inside cache when tree's slots are slots of
/// cache (same layer, K/V and slot strides, starting on a slot), else -1.
inline int64_t tree_slot_offset_in(const at::Tensor& cache, const at::Tensor& tree) {
  for (int64_t d = 0; d < 3; ++d)
    if (tree.stride(d) != cache.stride(d)) return -1;
  const int64_t slot_bytes = cache.stride(2) * cache.element_size();
  const int64_t offset = static_cast<const char*>(tree.const_data_ptr()) -
                         static_cast<const char*>(cache.const_data_ptr());
  if (slot_bytes <= 0 || offset < 0 || offset % slot_bytes != 0) return -1;
  const int64_t slots = offset / slot_bytes;
  return slots + tree.size(2) <= cache.size(2) ? slots : -1;
}

inline KvCommitCall prepare_kv_commit(const at::Tensor& cache, const at::Tensor& tree,
                                      const at::Tensor& src_slots, const at::Tensor& dst_slots) {
  check_kv_commit(cache, tree, src_slots, dst_slots);
  KvCommitCall call{kv_rows_dense(tree) ? tree : tree.contiguous(), src_slots.contiguous(),
                    dst_slots.contiguous(), {}};
  kernels::KvCommitParams& p = call.params;
  if (at::get_overlap_status(cache, call.tree) != at::MemOverlapStatus::No) {
    const int64_t offset = tree_slot_offset_in(cache, call.tree);
    if (offset >= 0) {
      p.tree_in_cache = true;
      p.tree_slot_offset = offset;
    } else {
      // Any other overlap is an odd view of the pool: copying the tree is rare and simplest.
      call.tree = call.tree.clone();
    }
  }
  p.cache = cache.data_ptr();
  p.cache_rows = kv_rows_of(cache);
  p.tree = call.tree.const_data_ptr();
  p.tree_rows = kv_rows_of(call.tree);
  p.num_layers = cache.size(0);
  p.row_bytes = cache.size(3) * cache.size(4) * cache.element_size();
  p.src_slots = call.src_slots.const_data_ptr<int64_t>();
  p.dst_slots = call.dst_slots.const_data_ptr<int64_t>();
  p.n = call.src_slots.size(0);
  return call;
}

inline void check_kv_commit_status(const kernels::KvCommitStatus& status) {
  TORCH_CHECK_VALUE(status.error == kernels::KvCommitError::kNone, "kv_commit: ", kernels::describe(status));
}

}  // namespace ssd::bindings
