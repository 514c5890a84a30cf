// The draft's per-row sampling settings, gathered once for SAGUARO sampling
// (sd drafter and ssd worker alike): each row is a sequence's next draft
// token, drawn from sigma with its keyed kDraft uniform at its position, or
// under the Gumbel coupling as the Gumbel-max draw from sigma with the
// noise the target draws that position with.
#pragma once

#include <cstdint>
#include <vector>

#include "../kernels/cpu/sampling.h"
#include "../model/backend.h"
#include "device_io.h"
#include "ssd/config.h"

namespace ssd::runtime {

struct DraftRows {
  int64_t vocab = 0;
  bool gumbel = false;
  std::vector<double> temperature, top_p, downweight, uniforms;
  std::vector<int64_t> top_k, fanout, tokens, positions;
  std::vector<uint64_t> seeds;

  DraftRows(int64_t vocab_size, bool gumbel_coupling) : vocab(vocab_size), gumbel(gumbel_coupling) {}

  /// Adds a row for a token at `position` of a sequence, drawn from
  /// sigma_{F, C} (F = fanout, C = downweight).
  void add(const SamplingParams& params, uint64_t seed, int64_t position, int64_t fanout_f, double c) {
    temperature.push_back(params.temperature);
    top_k.push_back(params.top_k);
    top_p.push_back(params.top_p);
    fanout.push_back(fanout_f);
    downweight.push_back(c);
    uniforms.push_back(kernels::keyed_uniform(seed, static_cast<uint64_t>(position), kernels::RandomPurpose::kDraft));
    seeds.push_back(seed);
    positions.push_back(position);
  }

  /// Draws every row on the backend's device, from logits [rows, vocab] there:
  /// returns the rows sampled from (q) [rows, vocab], left there; only the
  /// tokens come to the host (through `reads`). Under the Gumbel coupling a
  /// greedy row's sigma is one-hot, so its Gumbel-max draw is its argmax.
  /// The caller holds the backend's forward_scope.
  at::Tensor sample_on(const model::Backend& be, const at::Tensor& logits, HostReads& reads) {
    auto [q, drawn] = be.saguaro_sample(logits, upload(be, temperature, at::kDouble), upload(be, top_k, at::kLong),
                                        upload(be, top_p, at::kDouble), upload(be, fanout, at::kLong),
                                        upload(be, downweight, at::kDouble), upload(be, uniforms, at::kDouble));
    if (gumbel) drawn = be.gumbel_sample(q, upload(be, seeds, at::kLong), upload(be, positions, at::kLong));
    const at::Tensor host = reads.read(drawn);
    tokens.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    return q;
  }
};

}  // namespace ssd::runtime
