#include "sd_speculator.h"

#include <chrono>

#include "coupling.h"

namespace ssd::runtime {

SdSpeculator::SdSpeculator(const EngineConfig& config, std::shared_ptr<model::Model> draft)
    : drafter_(draft, config.num_kv_blocks(), config.kv_block_size, config.draft_threads,
               config.draft_matmul_min_rows, gumbel_coupling(config), config.kv_cache_dtype_on(config.draft_device)),
      vocab_(draft->config().vocab_size) {}

std::vector<DraftFailure> SdSpeculator::propose(std::vector<ScheduledChunk>& chunks,
                                                std::vector<Proposal>& proposals) {
  std::vector<Sequence*> seqs;
  std::vector<int64_t> counts;
  for (const auto& c : chunks)
    if (c.speculative) {
      seqs.push_back(c.seq);
      counts.push_back(c.draft_tokens);
    }
  if (seqs.empty()) return {};
  try {
    const auto t0 = std::chrono::steady_clock::now();
    drafts_ = drafter_.draft(seqs, counts);
    if (drafts_.slots > 0) {
      counters_.draft_rounds += 1;
      counters_.draft_forwards += drafts_.slots;
      counters_.draft_round_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  } catch (const std::exception& e) {
    // The whole batch was drafted together: every speculative chunk fails.
    std::vector<DraftFailure> failures;
    std::vector<ScheduledChunk> kept;
    std::vector<Proposal> kept_proposals;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].speculative) {
        failures.push_back({chunks[i].seq, std::string("draft failed: ") + e.what()});
        continue;
      }
      kept.push_back(chunks[i]);
      kept_proposals.push_back(std::move(proposals[i]));
    }
    chunks.swap(kept);
    proposals.swap(kept_proposals);
    return failures;
  }
  for (size_t i = 0, b = 0; i < chunks.size(); ++i) {
    if (!chunks[i].speculative) continue;
    const auto first = drafts_.tokens.begin() + static_cast<int64_t>(b) * drafts_.slots;
    proposals[i].tokens.assign(first, first + drafts_.counts[b]);
    proposals[i].q = drafts_.q[static_cast<int64_t>(b)];  // [slots, vocab] on the draft's device
    ++b;
  }
  return {};
}

void SdSpeculator::verified(Sequence* seq, const Proposal& /*proposal*/, int64_t accepted, int32_t /*bonus*/,
                            double /*verify_seconds*/) {
  // The draft KV of the verified token and the accepted proposals stays.
  drafter_.commit(seq->id, seq->len() + accepted);
}

void SdSpeculator::release(Sequence* seq, bool /*finished*/) { drafter_.release(seq->id); }

}  // namespace ssd::runtime
