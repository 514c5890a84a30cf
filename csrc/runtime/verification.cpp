#include "verification.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "../kernels/cpu/fork_select.h"
#include "../kernels/cpu/gumbel.h"
#include "../kernels/cpu/verify.h"

namespace ssd::runtime {

namespace {

void check_finite(const float* rows, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(rows[i])) throw std::runtime_error("logits contain NaN");
}

}  // namespace

Verdict verify_proposal(const float* target_rows, int64_t vocab, const Proposal& proposal,
                        const SamplingParams& params, uint64_t seed, int64_t start, bool fault_fast_argmax) {
  const auto count = static_cast<int64_t>(proposal.tokens.size());
  check_finite(target_rows, (1 + count) * vocab);
  // The kernel takes K >= 1 proposal slots; a round with none verifies only
  // the bonus (count 0), so one padding slot is enough.
  const int64_t slots = std::max<int64_t>(count, 1);
  std::vector<float> rows(static_cast<size_t>((slots + 1) * vocab), 0.0f);
  std::copy(target_rows, target_rows + (1 + count) * vocab, rows.begin());
  std::vector<int64_t> tokens(static_cast<size_t>(slots), 0);
  std::copy(proposal.tokens.begin(), proposal.tokens.end(), tokens.begin());
  std::vector<float> q(static_cast<size_t>(slots * vocab), 0.0f);
  if (!proposal.one_hot && count > 0) std::copy(proposal.q, proposal.q + count * vocab, q.begin());
  std::vector<double> accept_u(static_cast<size_t>(slots), 0.0);
  for (int64_t i = 0; i < count; ++i)
    accept_u[i] = kernels::keyed_uniform(seed, static_cast<uint64_t>(start + i), kernels::RandomPurpose::kAccept);
  const double bonus_u = kernels::keyed_uniform(seed, static_cast<uint64_t>(start), kernels::RandomPurpose::kResidual);
  const bool one_hot = proposal.one_hot;
  const double temperature = one_hot && fault_fast_argmax ? 0.0 : params.temperature;
  int64_t accepted = 0, bonus = 0;
  kernels::VerifyParams v;
  v.target_logits = rows.data();
  v.proposals = tokens.data();
  v.num_proposals = &count;
  v.q_probs = q.data();
  v.one_hot = &one_hot;
  v.temperature = &temperature;
  v.top_k = &params.top_k;
  v.top_p = &params.top_p;
  v.accept_uniforms = accept_u.data();
  v.bonus_uniforms = &bonus_u;
  v.accepted = &accepted;
  v.bonus = &bonus;
  v.batch = 1;
  v.k = slots;
  v.vocab = vocab;
  kernels::verify(v, 0, 1);
  return {accepted, static_cast<int32_t>(bonus)};
}

Verdict verify_gumbel(const float* target_rows, int64_t vocab, const Proposal& proposal,
                      const SamplingParams& params, uint64_t seed, int64_t start, const Coupling& coupling,
                      std::vector<float>& p, kernels::LogitsScratch& scratch) {
  const auto count = static_cast<int64_t>(proposal.tokens.size());
  check_finite(target_rows, (1 + count) * vocab);
  p.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0;; ++i) {
    const float* row = target_rows + i * vocab;
    int32_t token;
    if (params.temperature == 0.0) {
      token = kernels::argmax(row, vocab);
    } else {
      kernels::process_logits(row, vocab, {params.temperature, params.top_k, params.top_p}, p.data(), scratch);
      token = kernels::gumbel_argmax(p.data(), vocab, seed, coupling.noise_position(start + i));
    }
    if (i == count || proposal.tokens[i] != token) return {i, token};
  }
}

Verdict Verifier::verify(const float* target_rows, int64_t vocab, const Proposal& proposal, const Sequence& seq) {
  // Without TestingConfig's deliberate faults (config.h) this is the coupling's
  // verification (verify_proposal or verify_gumbel) at seq.len().
  SamplingParams params = seq.params;
  if (testing_.fault_batch_top_kp) {
    if (!has_first_) first_ = seq.params;
    has_first_ = true;
    params.top_k = first_.top_k;
    params.top_p = first_.top_p;
  }
  const int64_t key = testing_.fault_resume_stream && seq.preempted_len > 0 ? seq.preempted_len : seq.len();
  if (testing_.fault_peek_target && !proposal.one_hot && proposal.q != nullptr && params.temperature > 0) {
    Proposal sure = proposal;
    probs_.resize(static_cast<size_t>(vocab));
    size_t keep = 0;
    for (; keep < sure.tokens.size(); ++keep) {
      kernels::process_logits(target_rows + static_cast<int64_t>(keep) * vocab, vocab,
                              {params.temperature, params.top_k, params.top_p}, probs_.data(), scratch_);
      const int64_t x = sure.tokens[keep];
      if (probs_[x] < sure.q[static_cast<int64_t>(keep) * vocab + x]) break;
    }
    sure.tokens.resize(keep);
    if (coupling_.gumbel)
      return verify_gumbel(target_rows, vocab, sure, params, seq.seed, key, coupling_, probs_, scratch_);
    return verify_proposal(target_rows, vocab, sure, params, seq.seed, key, testing_.fault_fast_argmax);
  }
  if (coupling_.gumbel)
    return verify_gumbel(target_rows, vocab, proposal, params, seq.seed, key, coupling_, probs_, scratch_);
  return verify_proposal(target_rows, vocab, proposal, params, seq.seed, key, testing_.fault_fast_argmax);
}

int32_t TokenSampler::sample(const float* logits, int64_t vocab, const SamplingParams& p, uint64_t seed,
                             int64_t position) {
  check_finite(logits, vocab);
  if (p.temperature == 0.0) return kernels::argmax(logits, vocab);
  probs_.resize(static_cast<size_t>(vocab));
  kernels::process_logits(logits, vocab, {p.temperature, p.top_k, p.top_p}, probs_.data(), scratch_);
  if (coupling_.gumbel) return kernels::gumbel_argmax(probs_.data(), vocab, seed, coupling_.noise_position(position));
  const double u = kernels::keyed_uniform(seed, static_cast<uint64_t>(position), kernels::RandomPurpose::kSample);
  return kernels::sample_from_probs(probs_.data(), vocab, u);
}

TokenLogprobs LogprobReporter::report(const float* logits, int64_t vocab, const SamplingParams& p, int32_t token) {
  probs_.resize(static_cast<size_t>(vocab));
  kernels::process_logits(logits, vocab, {p.temperature, p.top_k, p.top_p}, probs_.data(), scratch_);
  TokenLogprobs out;
  out.logprob = static_cast<float>(std::log(static_cast<double>(probs_[token])));
  const int64_t n = std::min<int64_t>(p.logprobs, vocab);
  if (n <= 0) return out;
  // The top n by (probability desc, id asc): the one top-F selection, fork_select.
  best_.resize(static_cast<size_t>(n));
  const int64_t count = kernels::top_of_row(probs_.data(), vocab, n, best_.data());
  for (int64_t i = 0; i < count && probs_[best_[i]] > 0.0f; ++i) {
    out.top_tokens.push_back(static_cast<int32_t>(best_[i]));
    out.top_logprobs.push_back(static_cast<float>(std::log(static_cast<double>(probs_[best_[i]]))));
  }
  return out;
}

SpecCounters round_counters(const Proposal& proposal, int64_t accepted, int64_t emitted, bool finished) {
  auto count = static_cast<int64_t>(proposal.tokens.size());
  // The request ended inside the accepted run: the proposals after its last
  // token were never used, so they count neither as proposed nor as accepted.
  if (finished && emitted <= accepted) count = accepted = emitted;
  SpecCounters c;
  c.rounds = 1;
  c.draft_tokens_proposed = count;
  c.draft_tokens_accepted = accepted;
  switch (proposal.lookup) {
    case CacheLookup::kNone:
      return c;
    case CacheLookup::kHit:
      c.cache_hits = 1;
      c.hit_tokens = emitted;
      break;
    case CacheLookup::kFastFallback:
      c.fallback_fast = 1;
      c.fast_tokens_proposed = count;
      c.fast_tokens_accepted = accepted;
      c.miss_tokens = emitted;
      break;
    case CacheLookup::kNeuralFallback:
      c.fallback_neural = 1;
      c.miss_tokens = emitted;
      break;
  }
  c.cache_lookups = 1;
  return c;
}

}  // namespace ssd::runtime
