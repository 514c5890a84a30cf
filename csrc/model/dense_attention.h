// Prefill attention through stock dense kernels (at::scaled_dot_product_attention:
// flash attention on a GPU), for the cuda backend's batch_invariant=False
// forwards: a prefill's queries read each key tile once per tile of queries
// rather than once per query, which is what a long prompt's attention needs.
// Its reduction order is the stock kernel's, so rows are not batch-invariant.
// Written over ATen, so the same code runs (and is tested) on the CPU.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "backend.h"

namespace ssd::model {

/// A run of a forward's rows that extends one sequence: rows row..row+tokens-1
/// at positions first_position..first_position+tokens-1, keys 0.. read
/// through block-table row seq.
struct PrefillRun {
  int64_t row = 0, seq = 0, first_position = 0, tokens = 0;
};

/// The runs of `in` when every one of its tokens is in one (consecutive rows
/// of one sequence at consecutive positions, no padding, no forks, each
/// sequence once), each of at least min_run_tokens tokens; else empty: a
/// forward dense_attention does not take (a decode batch's one-token runs
/// are the paged kernel's).
std::vector<PrefillRun> prefill_runs(const ForwardInput& in, int64_t block_size, int64_t min_run_tokens);

/// Causal attention of q [T, Hq, d] (T = the runs' tokens) over k_cache,
/// v_cache [blocks, block_size, Hkv, d] through `in`'s block tables, run by
/// run: a run's keys are gathered dense, its query and key heads computed in
/// `compute` (kBFloat16 on a GPU for its flash kernel; kFloat for a reference),
/// with the causal mask (top-left for a run from position 0, else a mask that
/// also holds the sliding window) -> [T, Hq * d] fp32.
at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const std::vector<PrefillRun>& runs, const ForwardInput& in, float scale, int64_t window,
                           at::ScalarType compute);

}  // namespace ssd::model
