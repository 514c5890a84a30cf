#include "attention_splits.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace ssd::kernels {

AttentionPlan attention_plan(std::vector<RowRun> runs, const std::vector<int64_t>& first,
                             const std::vector<int64_t>& end, int64_t num_heads, int64_t head_dim) {
  AttentionPlan plan;
  plan.runs = std::move(runs);
  const size_t rows = first.size();
  plan.first_split.assign(rows, 0);
  plan.num_splits.assign(rows, 0);
  plan.partial_row.assign(rows, -1);
  int64_t partial_rows = 0;
  for (int64_t r = 0; r < static_cast<int64_t>(plan.runs.size()); ++r) {
    const RowRun& run = plan.runs[r];
    int64_t lo = -1, hi = -1;  // the splits any row of the run attends to
    for (int64_t t = run.first; t < run.first + run.count; ++t) {
      if (end[t] <= first[t]) {  // padding
        plan.needs_combine = true;
        continue;
      }
      plan.first_split[t] = first[t] / kSplitKeys;
      plan.num_splits[t] = key_splits(first[t], end[t]);
      const int64_t last_split = plan.first_split[t] + plan.num_splits[t] - 1;
      if (plan.num_splits[t] > 1) {
        plan.needs_combine = true;
        plan.partial_row[t] = partial_rows;
        partial_rows += plan.num_splits[t] * num_heads;
      }
      lo = lo < 0 ? plan.first_split[t] : std::min(lo, plan.first_split[t]);
      hi = std::max(hi, last_split);
    }
    for (int64_t j = lo; lo >= 0 && j <= hi; ++j) plan.pieces.push_back({r, j});
  }
  plan.partial.resize(static_cast<size_t>(partial_rows * head_dim));
  plan.partial_max.resize(static_cast<size_t>(partial_rows));
  plan.partial_denom.resize(static_cast<size_t>(partial_rows));
  return plan;
}

void attention_combine(const AttentionPlan& plan, float* out, int64_t ldo, int64_t num_heads, int64_t d,
                       int64_t begin, int64_t end) {
  for (int64_t t = begin; t < end; ++t) {
    float* row_out = out + t * ldo;
    const int64_t splits = plan.num_splits[t];
    if (splits == 0) std::fill_n(row_out, num_heads * d, 0.0f);  // padding: attends to nothing
    if (splits <= 1) continue;
    for (int64_t h = 0; h < num_heads; ++h) {
      const auto row = [&](int64_t j) { return plan.partial_row[t] + j * num_heads + h; };
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < splits; ++j) m = std::max(m, plan.partial_max[row(j)]);
      float denom = 0.0f;
      float* o = row_out + h * d;
      std::fill_n(o, d, 0.0f);
      for (int64_t j = 0; j < splits; ++j) {
        const float c = std::exp(plan.partial_max[row(j)] - m);
        denom = std::fma(plan.partial_denom[row(j)], c, denom);
        const float* acc = plan.partial.data() + row(j) * d;
        for (int64_t i = 0; i < d; ++i) o[i] = std::fma(acc[i], c, o[i]);
      }
      const float inv = 1.0f / denom;
      for (int64_t i = 0; i < d; ++i) o[i] *= inv;
    }
  }
}

}  // namespace ssd::kernels
