// Continuous batching over a paged KV cache: every step takes the running
// sequences (oldest first) and then admits waiting ones while the token budget,
// the batch limit and the free blocks allow. When a running sequence cannot get
// a block, the newest running sequence is preempted: its blocks are freed and
// it goes back to the front of the queue, to be recomputed later.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "../model/kv_cache.h"
#include "../model/model.h"
#include "ssd/config.h"
#include "ssd/types.h"

namespace ssd::runtime {

using Clock = std::chrono::steady_clock;

struct Sequence {
  RequestId id = 0;
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<int32_t> tokens;  ///< prompt followed by generated tokens
  int64_t prompt_len = 0;
  int64_t num_computed = 0;     ///< tokens whose KV is in the cache
  int64_t preempted_len = 0;    ///< length at its last preemption (0: never preempted)
  model::BlockTable table;
  RequestMetrics metrics;
  Clock::time_point enqueued;
  // Speculative modes (adaptive_policy.h): what the sequence's next round
  // verifies, and its acceptance estimate.
  int64_t lookahead = 0;        ///< proposals the next round verifies (0: an autoregressive step)
  bool trees = true;            ///< ssd: the draft builds a tree for the next round's outcomes
  /// ssd: the round before this one asked for a tree and speculated, so the
  /// draft built a tree beside it: only then can this round's lookup hit.
  bool tree_asked = false;
  /// Recent rounds (decayed): first proposals kept / verified, and later
  /// proposals (each after a kept one) kept / verified.
  double kept = 0.0, tried = 0.0, kept_next = 0.0, tried_next = 0.0;

  int64_t len() const { return static_cast<int64_t>(tokens.size()); }
  int64_t generated() const { return len() - prompt_len; }
};

/// One scheduled chunk: tokens [seq->num_computed, +num_tokens) of a sequence.
/// A speculative chunk is a decode step of a speculative mode: its one token
/// (the last) is verified together with up to `lookahead` draft tokens, for
/// which the chunk's sequence has cache room reserved.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int64_t num_tokens = 0;
  bool wants_logits = false;  ///< the chunk reaches the sequence's last token
  bool speculative = false;
  int64_t draft_tokens = 0;  ///< speculative: proposals this step has room for
};

struct ScheduleResult {
  std::vector<ScheduledChunk> chunks;
  std::vector<Sequence*> failed;  ///< sequences that can never fit; already removed
  std::string failure;
  std::vector<Sequence*> preempted;  ///< sent back to the queue by this schedule
};

class Scheduler {
 public:
  /// lookahead > 0 (speculative modes): prefill stops one token short of the
  /// end, and decode steps reserve room for lookahead extra tokens. The
  /// speculator frees a preempted sequence's draft state (ScheduleResult::preempted).
  Scheduler(const EngineConfig& config, model::KvCache& cache, int64_t lookahead = 0)
      : config_(config), cache_(cache), lookahead_(lookahead) {}

  void add(Sequence* seq) { waiting_.push_back(seq); }
  /// Removes a sequence from the queues and frees its blocks.
  void remove(Sequence* seq);
  ScheduleResult schedule();
  /// Builds the model input for a schedule. extra[i] (speculative chunks):
  /// draft tokens placed after chunk i's token; such a chunk wants logits for
  /// its token and each draft token.
  model::ForwardInput build_input(const std::vector<ScheduledChunk>& chunks,
                                  const std::vector<std::vector<int32_t>>& extra = {}) const;

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  std::vector<Sequence*> all() const;

 private:
  void preempt(Sequence* seq);
  void release(Sequence* seq);
  /// Tokens prefill must compute before decode steps take over.
  int64_t prefill_target(const Sequence* seq) const {
    return lookahead_ > 0 ? seq->len() - 1 : seq->len();
  }
  /// A sequence in a speculative mode whose prefill is done.
  bool decoding(const Sequence* seq) const {
    return lookahead_ > 0 && seq->num_computed >= seq->len() - 1;
  }
  /// Tokens the sequence could compute with its blocks plus every free block.
  int64_t room(const Sequence* seq) const;

  const EngineConfig& config_;
  model::KvCache& cache_;
  int64_t lookahead_;
  std::deque<Sequence*> running_;
  std::deque<Sequence*> waiting_;
  int64_t num_preemptions_ = 0;
  std::vector<Sequence*> preempted_;
};

}  // namespace ssd::runtime
