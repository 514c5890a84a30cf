// Fork selection: the candidate bonus tokens the draft prepares branches for.
// After accepting j of the K drafted tokens, the bonus token comes from the
// residual max(p - q, 0), which is zero at the rejected token x_{j+1}; so the
// candidates at position j < K skip x_{j+1}, and at j = K nothing is skipped.
#pragma once

#include <cstdint>

namespace ssd::kernels {

/// probs: [batch, positions, vocab] draft rows, positions = K + 1;
/// drafted: [batch, positions - 1]; fanout: [positions], 0 <= F_j <= max_fanout.
/// Outputs candidates: [batch, positions, max_fanout] (-1 padded) and
/// counts: [batch, positions].
struct ForkSelectParams {
  const float* probs = nullptr;
  const int64_t* drafted = nullptr;
  const int64_t* fanout = nullptr;
  int64_t batch = 0;
  int64_t positions = 0;
  int64_t vocab = 0;
  int64_t max_fanout = 0;
  int64_t* candidates = nullptr;
  int64_t* counts = nullptr;
};

/// Row (b, j) gets its min(F_j, vocab - excluded) best tokens, ranked by
/// (probability desc, token id asc), best first. Inputs are assumed validated.
/// Any float row ranks the same way: the ssd tree builder takes its fork
/// candidates from it (runtime/path_decoder.cpp: a logits row, positions = 1,
/// nothing drafted), so this is the code base's one top-F selection.
void fork_select(const ForkSelectParams& params);

/// fork_select over one row with nothing drafted: the `depth` best ids of
/// row[vocab] by (value desc, id asc) into best[0..count); returns count.
int64_t top_of_row(const float* row, int64_t vocab, int64_t depth, int64_t* best);

}  // namespace ssd::kernels
