#include "kv_commit.h"

#include <cstring>
#include <unordered_map>
#include <vector>

namespace ssd::kernels {
namespace {

using SlotIndex = std::unordered_map<int64_t, int64_t>;  // dst slot -> i

KvCommitStatus validate(const KvCommitParams& p, SlotIndex& dst_index) {
  dst_index.reserve(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t src = p.src_slots[i];
    const int64_t dst = p.dst_slots[i];
    if (src < 0 || src >= p.tree_rows.num_slots)
      return {KvCommitError::kSrcOutOfRange, i, src, p.tree_rows.num_slots};
    if (dst < 0 || dst >= p.cache_rows.num_slots)
      return {KvCommitError::kDstOutOfRange, i, dst, p.cache_rows.num_slots};
    const auto [it, fresh] = dst_index.emplace(dst, i);
    if (!fresh) return {KvCommitError::kDuplicateDst, i, dst, it->second};
  }
  return {};
}

// Rows i (ascending) whose source slot an earlier row j < i overwrites when
// rows are copied in order: they are read into staging first.
std::vector<int64_t> rows_to_stage(const KvCommitParams& p, const SlotIndex& dst_index) {
  std::vector<int64_t> rows;
  if (!p.tree_in_cache) return rows;
  for (int64_t i = 0; i < p.n; ++i) {
    const auto it = dst_index.find(p.src_slots[i] + p.tree_slot_offset);
    if (it != dst_index.end() && it->second < i) rows.push_back(i);
  }
  return rows;
}

// Rows of a [layers, 2, slots, row] view picked by `slots`.
template <typename Byte>
struct RowSet {
  Byte* base;
  KvRows rows;
  const int64_t* slots;

  Byte* row(int64_t layer, int64_t kind, int64_t i) const {
    return base + layer * rows.layer_stride + kind * rows.kind_stride + slots[i] * rows.slot_stride;
  }
};

void commit_plane(const RowSet<char>& cache, const RowSet<const char>& tree,
                  const std::vector<int64_t>& staged, char* staging, int64_t layer, int64_t kind, int64_t n,
                  size_t row_bytes) {
  for (size_t k = 0; k < staged.size(); ++k)
    std::memcpy(staging + k * row_bytes, tree.row(layer, kind, staged[k]), row_bytes);
  size_t next_staged = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool is_staged = next_staged < staged.size() && staged[next_staged] == i;
    const char* from = is_staged ? staging + next_staged++ * row_bytes : tree.row(layer, kind, i);
    char* to = cache.row(layer, kind, i);
    if (to != from) std::memcpy(to, from, row_bytes);  // equal: a row committed onto itself
  }
}

}  // namespace

KvCommitStatus kv_commit(const KvCommitParams& p) {
  SlotIndex dst_index;
  const KvCommitStatus status = validate(p, dst_index);
  if (status.error != KvCommitError::kNone) return status;
  const std::vector<int64_t> staged = rows_to_stage(p, dst_index);
  const auto row_bytes = static_cast<size_t>(p.row_bytes);
  std::vector<char> staging(staged.size() * row_bytes);
  const RowSet<char> cache{static_cast<char*>(p.cache), p.cache_rows, p.dst_slots};
  const RowSet<const char> tree{static_cast<const char*>(p.tree), p.tree_rows, p.src_slots};
  for (int64_t l = 0; l < p.num_layers; ++l)
    for (int64_t kind = 0; kind < 2; ++kind)
      commit_plane(cache, tree, staged, staging.data(), l, kind, p.n, row_bytes);
  return status;
}

std::string describe(const KvCommitStatus& s) {
  const std::string at = "[" + std::to_string(s.item) + "] = " + std::to_string(s.value);
  switch (s.error) {
    case KvCommitError::kNone:
      return "ok";
    case KvCommitError::kSrcOutOfRange:
      return "src_slots" + at + " is outside the tree's slots [0, " + std::to_string(s.detail) + ")";
    case KvCommitError::kDstOutOfRange:
      return "dst_slots" + at + " is outside the cache's slots [0, " + std::to_string(s.detail) + ")";
    case KvCommitError::kDuplicateDst:
      return "dst_slots" + at + " repeats dst_slots[" + std::to_string(s.detail) +
             "]: two rows cannot be committed to one slot";
  }
  return "unknown kv_commit error";
}

}  // namespace ssd::kernels
