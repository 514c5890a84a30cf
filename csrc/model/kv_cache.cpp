#include "kv_cache.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include "backend.h"

namespace ssd::model {

KvCache::KvCache(const ModelConfig& config, int64_t num_blocks, int64_t block_size, const Backend& backend,
                 const std::string& dtype)
    : id_([] {
        static std::atomic<int64_t> next{0};
        return next++;
      }()),
      backend_(&backend),
      num_blocks_(num_blocks),
      block_size_(block_size),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      dtype_(dtype) {
  if (dtype != "float32" && dtype != "bfloat16")
    throw std::invalid_argument("KV cache dtype must be 'float32' or 'bfloat16', got '" + dtype + "'");
  if (num_blocks <= 0 || block_size <= 0)
    throw std::invalid_argument("KV cache needs num_blocks > 0 and block_size > 0, got " +
                                std::to_string(num_blocks) + " and " + std::to_string(block_size));
  storage_ = backend.kv_storage({config.num_layers, 2, num_blocks, block_size, num_kv_heads_, head_dim_},
                                dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
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
  if (storage_.scalar_type() == at::kBFloat16) {
    auto* base = reinterpret_cast<uint16_t*>(storage_.data_ptr<at::BFloat16>()) + index * 2 * per_kind;
    return kernels::PagedKv{nullptr, nullptr, block_size_, num_kv_heads_, head_dim_, base, base + per_kind};
  }
  float* base = storage_.data_ptr<float>() + index * 2 * per_kind;
  return kernels::PagedKv{base, base + per_kind, block_size_, num_kv_heads_, head_dim_};
}

kernels::KvRows KvCache::rows() const {
  kernels::KvRows rows;
  rows.slot_stride = num_kv_heads_ * head_dim_ * static_cast<int64_t>(storage_.element_size());
  rows.kind_stride = num_slots() * rows.slot_stride;
  rows.layer_stride = 2 * rows.kind_stride;
  rows.num_slots = num_slots();
  return rows;
}

}  // namespace ssd::model
