// The draft's per-row sampling settings, gathered once for SAGUARO sampling
// (sd drafter and ssd worker alike): each row is a sequence's next draft
// token, drawn from sigma with its keyed kDraft uniform at its position, or
// under the Gumbel coupling as the Gumbel-max draw from sigma with the
// noise the target draws that position with.
#pragma once

#include <cstdint>
#include <vector>

#include "../kernels/cpu/gumbel.h"
#include "../kernels/cpu/sampling.h"
#include "../kernels/cpu/saguaro_sample.h"
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
  std::vector<float> probs;  ///< [rows, vocab]: the rows sampled from (q)

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

  /// Samples every row from `logits` [rows, vocab]; fills tokens and probs.
  void sample(const float* logits) {
    const auto n = static_cast<int64_t>(temperature.size());
    tokens.assign(static_cast<size_t>(n), 0);
    probs.assign(static_cast<size_t>(n * vocab), 0.0f);
    kernels::SaguaroSampleParams p;
    p.logits = logits;
    p.rows = n;
    p.vocab = vocab;
    p.temperature = temperature.data();
    p.top_k = top_k.data();
    p.top_p = top_p.data();
    p.fanout = fanout.data();
    p.downweight = downweight.data();
    p.uniforms = uniforms.data();
    p.probs = probs.data();
    p.tokens = tokens.data();
    kernels::saguaro_sample(p);
    if (!gumbel) return;
    for (int64_t r = 0; r < n; ++r)
      if (temperature[r] > 0.0)
        tokens[r] = kernels::gumbel_argmax(probs.data() + r * vocab, vocab, seeds[r], static_cast<uint64_t>(positions[r]));
  }

  /// The same draw on the backend's device, from logits [rows, vocab] there:
  /// returns the rows sampled from (q) [rows, vocab], left there; only the
  /// tokens come to the host (through `reads`). Under the Gumbel coupling a
  /// greedy row's sigma is one-hot, so its Gumbel-max draw is its argmax, as
  /// above. The caller holds the backend's forward_scope.
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
