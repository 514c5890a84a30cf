// Work units shared by paged and fork attention: runs of query rows of one
// sequence, and the cache slot of a position.
#pragma once

#include <cstdint>
#include <vector>

namespace ssd::kernels {

inline int64_t slot_of(const int32_t* table, int64_t pos, int64_t block_size) {
  return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
}

/// Runs of consecutive entries of seq[0..n) with the same value, at most
/// max_run long: the query rows that attend_rows can serve together.
struct RowRun {
  int64_t first;
  int64_t count;
};

inline std::vector<RowRun> same_sequence_runs(const int32_t* seq, int64_t n, int64_t max_run) {
  std::vector<RowRun> runs;
  for (int64_t i = 0; i < n; ++i) {
    if (!runs.empty() && seq[i] == seq[runs.back().first] && runs.back().count < max_run) ++runs.back().count;
    else runs.push_back({i, 1});
  }
  return runs;
}

}  // namespace ssd::kernels
