#include "kv_truncate.h"

#include <unordered_map>

namespace ssd::kernels {
namespace {

KvTruncateStatus validate_sequences(const KvTruncateParams& p) {
  std::unordered_map<int64_t, int64_t> first_use;
  first_use.reserve(static_cast<size_t>(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    const int64_t seq = p.seq_ids[i];
    if (seq < 0 || seq >= p.num_seqs) return {KvTruncateError::kSeqOutOfRange, i, seq, p.num_seqs};
    const auto [it, fresh] = first_use.emplace(seq, i);
    if (!fresh) return {KvTruncateError::kDuplicateSeq, i, seq, it->second};
    const int64_t len = p.seq_lens[seq];
    if (p.new_lens[i] < 0 || p.new_lens[i] > len)
      return {KvTruncateError::kLengthOutOfRange, i, p.new_lens[i], len};
  }
  return {};
}

// Calls fn(i, entry) for every block table entry that item i releases, in
// (i, entry index) order; returns the first non-ok status fn gives.
template <typename Fn>
KvTruncateStatus for_each_released(const KvTruncateParams& p, Fn&& fn) {
  for (int64_t i = 0; i < p.n; ++i) {
    int32_t* row = p.block_tables + p.seq_ids[i] * p.max_blocks;
    for (int64_t j = (p.new_lens[i] + p.block_size - 1) / p.block_size; j < p.max_blocks; ++j) {
      if (row[j] == -1) continue;
      const KvTruncateStatus status = fn(i, row[j]);
      if (status.error != KvTruncateError::kNone) return status;
    }
  }
  return {};
}

void add_to_released(const KvTruncateParams& p, int32_t delta) {
  for_each_released(p, [&](int64_t, int32_t& block) {
    p.block_refcount[block] += delta;
    return KvTruncateStatus{};
  });
}

}  // namespace

KvTruncateStatus kv_truncate(const KvTruncateParams& p) {
  KvTruncateStatus status = validate_sequences(p);
  if (status.error != KvTruncateError::kNone) return status;
  status = for_each_released(p, [&](int64_t i, int32_t& block) {
    if (block < 0 || block >= p.num_blocks)
      return KvTruncateStatus{KvTruncateError::kBadBlock, i, block, p.num_blocks};
    return KvTruncateStatus{};
  });
  if (status.error != KvTruncateError::kNone) return status;
  // Decrementing first and checking after catches a block released by two
  // sequences of this call (a shared prefix page) that had only one reference.
  add_to_released(p, -1);
  status = for_each_released(p, [&](int64_t i, int32_t& block) {
    if (p.block_refcount[block] < 0)
      return KvTruncateStatus{KvTruncateError::kRefcountUnderflow, i, block, 0};
    return KvTruncateStatus{};
  });
  if (status.error != KvTruncateError::kNone) {
    add_to_released(p, +1);
    return status;
  }
  for_each_released(p, [](int64_t, int32_t& block) {
    block = -1;
    return KvTruncateStatus{};
  });
  for (int64_t i = 0; i < p.n; ++i) p.seq_lens[p.seq_ids[i]] = static_cast<int32_t>(p.new_lens[i]);
  return status;
}

std::string describe(const KvTruncateStatus& s) {
  const std::string i = std::to_string(s.item);
  const std::string v = std::to_string(s.value);
  const std::string d = std::to_string(s.detail);
  switch (s.error) {
    case KvTruncateError::kNone:
      return "ok";
    case KvTruncateError::kSeqOutOfRange:
      return "seq_ids[" + i + "] = " + v + " is outside the block tables' rows [0, " + d + ")";
    case KvTruncateError::kDuplicateSeq:
      return "seq_ids[" + i + "] = " + v + " repeats seq_ids[" + d + "]";
    case KvTruncateError::kLengthOutOfRange:
      return "new_lens[" + i + "] = " + v + " is outside [0, " + d +
             "] (a sequence can only be shortened, to at most its current length)";
    case KvTruncateError::kBadBlock:
      return "the block table of seq_ids[" + i + "] holds block " + v + " outside [0, " + d +
             ") in an entry to release (only -1 marks an empty entry)";
    case KvTruncateError::kRefcountUnderflow:
      return "releasing the blocks of seq_ids[" + i + "] would drive the refcount of block " + v +
             " below 0";
  }
  return "unknown kv_truncate error";
}

}  // namespace ssd::kernels
