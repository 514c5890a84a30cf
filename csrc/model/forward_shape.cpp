#include "forward_shape.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "../kernels/key_splits.h"

namespace ssd::model {

int64_t bucket_size(int64_t n) {
  static constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, kMaxBucketTokens};
  for (const int64_t b : kBuckets)
    if (n <= b) return b;
  return 0;
}

int64_t next_power_of_two(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

std::optional<ForwardShape> forward_shape(const ForwardInput& in) {
  const auto t = static_cast<int64_t>(in.tokens.size());
  if (t == 0 || t > kMaxBucketTokens || static_cast<int64_t>(in.logit_rows.size()) > kMaxBucketTokens)
    return std::nullopt;
  ForwardShape s;
  s.tokens = bucket_size(t);
  s.logit_rows = bucket_size(std::max<int64_t>(1, static_cast<int64_t>(in.logit_rows.size())));
  const int64_t seqs = in.max_blocks > 0 ? static_cast<int64_t>(in.block_tables.size()) / in.max_blocks : 0;
  s.seqs = next_power_of_two(seqs + 1);
  s.max_blocks = next_power_of_two(std::max<int64_t>(8, in.max_blocks));
  s.forks = in.forks();
  return s;
}

ForwardInput padded_input(const ForwardInput& in, const ForwardShape& shape, int64_t key_bound) {
  const auto t = static_cast<int64_t>(in.tokens.size());
  const int64_t seqs = in.max_blocks > 0 ? static_cast<int64_t>(in.block_tables.size()) / in.max_blocks : 0;
  if (shape.tokens < t || shape.logit_rows < static_cast<int64_t>(in.logit_rows.size()) || shape.seqs <= seqs ||
      shape.max_blocks < in.max_blocks || shape.forks != in.forks())
    throw std::invalid_argument("padded_input: the shape (" + std::to_string(shape.tokens) + " tokens, " +
                                std::to_string(shape.seqs) + " table rows of " + std::to_string(shape.max_blocks) +
                                ") does not hold the forward (" + std::to_string(t) + " tokens, " +
                                std::to_string(seqs) + " rows of " + std::to_string(in.max_blocks) + ")");
  ForwardInput p;
  const auto pad = [](std::vector<int32_t> v, int64_t n, int32_t value) {
    v.resize(static_cast<size_t>(n), value);
    return v;
  };
  const auto padding_seq = static_cast<int32_t>(shape.seqs - 1);
  p.tokens = pad(in.tokens, shape.tokens, 0);
  p.positions = pad(in.positions, shape.tokens, 0);
  p.seq_of_token = pad(in.seq_of_token, shape.tokens, padding_seq);
  p.max_blocks = shape.max_blocks;
  p.block_tables.assign(static_cast<size_t>(shape.seqs * shape.max_blocks), -1);
  for (int64_t s = 0; s < seqs; ++s)
    std::copy_n(in.block_tables.begin() + s * in.max_blocks, in.max_blocks,
                p.block_tables.begin() + s * shape.max_blocks);
  p.logit_rows = pad(in.logit_rows, shape.logit_rows, 0);
  if (shape.forks) {
    p.prefix_seq = pad(in.prefix_seq, shape.tokens, padding_seq);
    p.prefix_len = pad(in.prefix_len, shape.tokens, 0);
  }
  p.matmul_min_rows = in.matmul_min_rows;
  p.key_bound = key_bound > 0 ? key_bound : in.key_bound;
  return p;
}

bool graph_worthy(const ForwardInput& in, const ForwardShape& shape, int64_t key_bound, int64_t num_heads,
                  int64_t head_dim) {
  const int64_t seqs = in.max_blocks > 0 ? static_cast<int64_t>(in.block_tables.size()) / in.max_blocks : 0;
  std::vector<int64_t> run(static_cast<size_t>(seqs), 0);  // tokens of each table row (Model::check: rows < seqs)
  for (const int32_t s : in.seq_of_token)
    if (s >= 0 && s < seqs && ++run[static_cast<size_t>(s)] > kMaxGraphedRun) return false;
  const int64_t splits = kernels::max_key_splits_below(key_bound, /*window=*/0);
  return splits <= 1 || shape.tokens * splits * num_heads * head_dim * int64_t{4} <= kMaxGraphSplitBytes;
}

}  // namespace ssd::model
