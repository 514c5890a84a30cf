#include "kv_cache.h"

#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ssd::model {

namespace {

// Anonymous memory reads as zeros and becomes resident only where it is
// written, so a large cache costs only the blocks sequences have used.
at::Tensor reserve_zeroed(std::vector<int64_t> sizes) {
  size_t bytes = sizeof(float);
  for (int64_t s : sizes) bytes *= static_cast<size_t>(s);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::invalid_argument("KV cache: could not reserve " + std::to_string(bytes >> 20) +
                                " MiB (" + std::strerror(errno) + "); lower kv_cache_gib or kv_capacity_tokens");
  return at::from_blob(p, sizes, [bytes](void* q) { munmap(q, bytes); }, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

KvCache::KvCache(const ModelConfig& config, int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim) {
  if (num_blocks <= 0 || block_size <= 0)
    throw std::invalid_argument("KV cache needs num_blocks > 0 and block_size > 0, got " +
                                std::to_string(num_blocks) + " and " + std::to_string(block_size));
  storage_ = reserve_zeroed({config.num_layers, 2, num_blocks, block_size, num_kv_heads_, head_dim_});
  free_.reserve(static_cast<size_t>(num_blocks));
  // Low block ids are handed out first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

bool KvCache::reserve(BlockTable& table, int64_t num_tokens) {
  const int64_t need = blocks_for(num_tokens) - static_cast<int64_t>(table.blocks.size());
  if (need <= 0) return true;
  if (need > num_free_blocks()) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

void KvCache::truncate(BlockTable& table, int64_t keep_tokens) {
  const auto keep = static_cast<size_t>(blocks_for(keep_tokens));
  while (table.blocks.size() > keep) {
    free_.push_back(table.blocks.back());
    table.blocks.pop_back();
  }
}

kernels::PagedKv KvCache::layer(int64_t index) {
  const int64_t per_kind = num_blocks_ * block_size_ * num_kv_heads_ * head_dim_;
  float* base = storage_.data_ptr<float>() + index * 2 * per_kind;
  return kernels::PagedKv{base, base + per_kind, block_size_, num_kv_heads_, head_dim_};
}

}  // namespace ssd::model
