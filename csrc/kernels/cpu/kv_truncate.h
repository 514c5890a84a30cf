// KV truncate: rollback after a partial acceptance. A sequence is shortened
// and the blocks past its new end leave its block table. Blocks are
// refcounted because forks share their prefix pages: a block is free when
// its refcount reaches 0, and collecting free blocks is the caller's job
// (e.g. compare refcounts before and after, or scan for zeros).
#pragma once

#include <cstdint>
#include <string>

namespace ssd::kernels {

/// For each listed sequence s = seq_ids[i]: seq_lens[s] = new_lens[i]; every
/// entry j >= ceil(new_lens[i] / block_size) of its block table that is not
/// -1 has its block's refcount decremented and becomes -1.
struct KvTruncateParams {
  int32_t* block_tables = nullptr;  ///< [num_seqs, max_blocks], -1 = no block
  int32_t* seq_lens = nullptr;      ///< [num_seqs]
  int32_t* block_refcount = nullptr;  ///< [num_blocks]
  int64_t num_seqs = 0;
  int64_t max_blocks = 0;
  int64_t num_blocks = 0;
  const int64_t* seq_ids = nullptr;   ///< [n], pairwise distinct
  const int64_t* new_lens = nullptr;  ///< [n], 0 <= new_lens[i] <= seq_lens[seq_ids[i]]
  int64_t n = 0;
  int64_t block_size = 0;  ///< > 0
};

enum class KvTruncateError : int64_t {
  kNone = 0,
  kSeqOutOfRange = 1,
  kDuplicateSeq = 2,
  kLengthOutOfRange = 3,
  kBadBlock = 4,
  kRefcountUnderflow = 5,
};

/// Errors are checked in that order, each for the first bad i (and, for the
/// block errors, the first bad table entry of that sequence). value: the
/// offending seq id, length or block id; detail: the bound it broke, or the
/// earlier index of a repeated seq id.
struct KvTruncateStatus {
  KvTruncateError error = KvTruncateError::kNone;
  int64_t item = -1;
  int64_t value = 0;
  int64_t detail = 0;
};

/// Validates everything before mutating: on an error nothing changes.
/// Kept for the GPU tree; the runtime does not call it yet (model::KvCache
/// frees its own blocks).
KvTruncateStatus kv_truncate(const KvTruncateParams& params);

/// One-line description of an error status (names the argument and index).
std::string describe(const KvTruncateStatus& status);

}  // namespace ssd::kernels
