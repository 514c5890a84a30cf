// The bucket shapes a forward is padded to so that one captured CUDA graph
// (backend_cuda.cpp) replays every forward of a shape: the token and
// logit-row counts rounded up to a short list, the block table's rows and
// width to powers of two. Padding is inert by the forward's own rule (a
// token whose block-table entry is -1 writes no K / V and reads none), so a
// padded forward's logits for the real rows are bitwise the unpadded ones,
// on every backend: the cpu and aten backends run padded forwards as they are,
// which is how the rule is tested without a GPU. Plain C++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>

#include "backend.h"

namespace ssd::model {

/// The most tokens a bucket holds: longer forwards (prefills) run unpadded,
/// without a graph (their launches are few against their work).
constexpr int64_t kMaxBucketTokens = 512;

/// The longest run of one table row's tokens in a forward the cuda backend
/// captures. Longer runs are prompt chunks: their launches are few against
/// their work, and their shapes change from prompt to prompt, so their graphs
/// would push the decode, verify and tree graphs out of a role's few.
constexpr int64_t kMaxGraphedRun = 64;

/// The most bytes a captured forward's attention split workspace may take
/// (graph_worthy): the role's memory pool keeps what its largest graph needs
/// for the process's life.
constexpr int64_t kMaxGraphSplitBytes = int64_t{256} << 20;

/// A forward's padded shape: what a captured graph is keyed by.
struct ForwardShape {
  int64_t tokens = 0;      ///< T rows (tokens, positions, seq_of_token, and the forks' arrays)
  int64_t seqs = 0;        ///< block-table rows; the last one holds -1 only (the padding tokens' sequence)
  int64_t max_blocks = 0;  ///< block-table width
  int64_t logit_rows = 0;
  bool forks = false;

  bool operator==(const ForwardShape& o) const {
    return tokens == o.tokens && seqs == o.seqs && max_blocks == o.max_blocks && logit_rows == o.logit_rows &&
           forks == o.forks;
  }
};

struct ForwardShapeHash {
  size_t operator()(const ForwardShape& s) const {
    size_t h = std::hash<int64_t>{}(s.tokens);
    for (const int64_t v : {s.seqs, s.max_blocks, s.logit_rows, int64_t{s.forks}})
      h = h * 1000003u ^ std::hash<int64_t>{}(v);
    return h;
  }
};

/// n rounded up to the bucket list 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128,
/// 192, 256, 384, 512 (each at most 1.5x the one below from 16 on); 0 for
/// n > kMaxBucketTokens.
int64_t bucket_size(int64_t n);

/// The smallest power of two >= n (n >= 1).
int64_t next_power_of_two(int64_t n);

/// The shape `in` pads to, or nullopt when it has no tokens or more than
/// kMaxBucketTokens of them: tokens and logit rows by bucket_size, the
/// table's rows (one more, the padding row) and width (at least 8) by
/// next_power_of_two.
std::optional<ForwardShape> forward_shape(const ForwardInput& in);

/// `in` padded to `shape` (which must hold it: forward_shape's or larger):
/// its arrays first, as they are; then padding tokens (token 0 at position
/// 0 of the last table row, whose entries are -1: slot -1), table rows of -1
/// only and -1 past each row's width, logit rows reading row 0, and padding
/// rows forking nowhere (prefix row of their own, length 0). `key_bound` > 0
/// becomes the padded input's key_bound (what a graph replayed for later
/// positions sizes its attention by). std::invalid_argument when `shape`
/// is smaller than `in`.
ForwardInput padded_input(const ForwardInput& in, const ForwardShape& shape, int64_t key_bound);

/// Whether the cuda backend captures `in` padded to `shape` (forward_shape's)
/// rather than launching it as it is: no table row has more than
/// kMaxGraphedRun of its tokens, and the attention's split workspace at
/// `key_bound` (shape.tokens x key splits below key_bound, no window, x
/// num_heads x head_dim fp32 partials; none with one split) is at most
/// kMaxGraphSplitBytes.
bool graph_worthy(const ForwardInput& in, const ForwardShape& shape, int64_t key_bound, int64_t num_heads,
                  int64_t head_dim);

}  // namespace ssd::model
