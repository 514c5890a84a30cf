// KV commit: after a speculation-cache hit, the accepted branch's K/V rows
// move from tree pages into the sequence's own cache slots instead of being
// recomputed. A slot is block * block_size + offset of the paged storage
// [layers, 2, blocks, block_size, kv_heads, head_dim], viewed as
// [layers, 2, slots, kv_heads, head_dim].
#pragma once

#include <cstdint>
#include <string>

namespace ssd::kernels {

/// Byte strides of a [layers, 2, slots, row] view whose rows (kv_heads *
/// head_dim elements) are contiguous.
struct KvRows {
  int64_t layer_stride = 0;
  int64_t kind_stride = 0;  ///< K plane -> V plane
  int64_t slot_stride = 0;
  int64_t num_slots = 0;
};

/// cache[l, k, dst[i]] = tree[l, k, src[i]] for every layer l and kind k.
/// Element type agnostic: rows are copied as row_bytes bytes.
struct KvCommitParams {
  void* cache = nullptr;
  KvRows cache_rows;
  const void* tree = nullptr;
  KvRows tree_rows;
  int64_t num_layers = 0;
  int64_t row_bytes = 0;
  const int64_t* src_slots = nullptr;  ///< [n] tree slots
  const int64_t* dst_slots = nullptr;  ///< [n] cache slots, pairwise distinct
  int64_t n = 0;
  /// Tree pages inside the cache: tree slot s is cache slot s + tree_slot_offset
  /// (same layer, K/V and slot strides). The result is then as if every row
  /// were read before any is written: a dst slot that is also a source keeps
  /// providing its old row.
  bool tree_in_cache = false;
  int64_t tree_slot_offset = 0;
};

enum class KvCommitError : int64_t { kNone = 0, kSrcOutOfRange = 1, kDstOutOfRange = 2, kDuplicateDst = 3 };

/// The first bad index i (in order); value is the offending slot, detail the
/// slot count (range errors) or the earlier index holding the same dst slot.
struct KvCommitStatus {
  KvCommitError error = KvCommitError::kNone;
  int64_t item = -1;
  int64_t value = 0;
  int64_t detail = 0;
};

/// Validates every index first; on an error nothing is written.
KvCommitStatus kv_commit(const KvCommitParams& params);

/// One-line description of an error status (names the argument and index).
std::string describe(const KvCommitStatus& status);

}  // namespace ssd::kernels
