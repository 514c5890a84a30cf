// Paged KV cache: fixed-size blocks handed out from a free list; a sequence
// owns a block table that maps its positions to cache slots.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/cpu/kv_commit.h"
#include "../kernels/cpu/ops.h"
#include "ssd/config.h"

namespace ssd::model {

class Backend;

/// Blocks of one sequence, in position order.
struct BlockTable {
  std::vector<int32_t> blocks;
};

class KvCache {
 public:
  /// num_blocks blocks of block_size zeroed slots for every layer, of dtype
  /// "float32" or "bfloat16" (std::invalid_argument otherwise), on the
  /// backend's device (the cpu backend reserves them: pages become resident
  /// as blocks are first written). The backend must outlive the cache.
  KvCache(const ModelConfig& config, int64_t num_blocks, int64_t block_size, const Backend& backend,
          const std::string& dtype = "float32");

  /// A number no other cache of this process has had (a tensor-parallel
  /// follower keeps one cache per id of its leader's).
  int64_t id() const { return id_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free_blocks() const { return static_cast<int64_t>(free_.size()); }
  /// Slots of every layer's K (and V) plane: num_blocks * block_size.
  int64_t num_slots() const { return num_blocks_ * block_size_; }
  /// Blocks needed to hold num_tokens positions.
  int64_t blocks_for(int64_t num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  /// Grows `table` to cover num_tokens positions. Returns false and changes
  /// nothing when the free list is too short.
  bool reserve(BlockTable& table, int64_t num_tokens);
  /// Keeps the blocks covering the first keep_tokens positions, frees the rest.
  void truncate(BlockTable& table, int64_t keep_tokens);

  /// "float32" or "bfloat16".
  const std::string& dtype() const { return dtype_; }
  /// Layer view for the kernels (device pointers on a GPU backend; k / v
  /// for an fp32 cache, k_bf16 / v_bf16 for a bf16 one).
  kernels::PagedKv layer(int64_t index);
  /// [layers, 2, num_blocks, block_size, kv_heads, head_dim], shared with the cache.
  const at::Tensor& storage() const { return storage_; }
  /// The storage as kv_commit's [layers, 2, slots, row] byte strides.
  kernels::KvRows rows() const;
  /// The backend the storage lives on (it runs the cache's KV copies).
  const Backend& backend() const { return *backend_; }

 private:
  int64_t id_;
  const Backend* backend_;
  int64_t num_blocks_;
  int64_t block_size_;
  int64_t num_kv_heads_;
  int64_t head_dim_;
  std::string dtype_;
  at::Tensor storage_;  // [layers, 2, num_blocks, block_size, kv_heads, head_dim]
  std::vector<int32_t> free_;
};

}  // namespace ssd::model
