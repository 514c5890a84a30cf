#include "scheduler.h"

#include <algorithm>

#include "ssd/log.h"

namespace ssd::runtime {

void Scheduler::remove(Sequence* seq) {
  auto drop = [seq](std::deque<Sequence*>& q) {
    q.erase(std::remove(q.begin(), q.end(), seq), q.end());
  };
  drop(running_);
  drop(waiting_);
  release(seq);
}

void Scheduler::release(Sequence* seq) {
  cache_.truncate(seq->table, 0);
  seq->num_computed = 0;
}

void Scheduler::preempt(Sequence* seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
  release(seq);
  seq->metrics.num_preemptions += 1;
  seq->preempted_len = seq->len();
  num_preemptions_ += 1;
  waiting_.push_front(seq);
  preempted_.push_back(seq);
  SSD_LOG_INFO("preempted request " << seq->id << " (" << seq->len() << " tokens) for want of KV blocks; "
                                    << cache_.num_free_blocks() << " of " << cache_.num_blocks() << " blocks free");
}

int64_t Scheduler::room(const Sequence* seq) const {
  const int64_t blocks = static_cast<int64_t>(seq->table.blocks.size()) + cache_.num_free_blocks();
  return blocks * cache_.block_size() - seq->num_computed;
}

ScheduleResult Scheduler::schedule() {
  ScheduleResult result;
  int64_t budget = config_.max_batched_tokens;
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* seq = running_[i];
    const bool spec = decoding(seq);
    int64_t n = spec ? 1 : std::min(prefill_target(seq) - seq->num_computed, budget);
    // A speculative step wants room for its draft tokens, but can run without.
    const int64_t want = n + (spec ? std::min(lookahead_, config_.max_model_len - seq->len()) : 0);
    while (room(seq) < want && running_.back() != seq) preempt(running_.back());
    if (!spec) n = std::min(n, room(seq));
    if (n <= 0 || room(seq) < n) {
      if (i == 0) {
        // Alone and still no room: the cache cannot hold this sequence at all.
        result.failure = "the KV cache (" +
                         std::to_string(cache_.num_blocks() * cache_.block_size()) +
                         " tokens) cannot hold this request's " + std::to_string(seq->len()) +
                         " tokens";
        remove(seq);
        result.failed.push_back(seq);
        continue;
      }
      preempt(seq);  // it is the newest one left
      break;
    }
    const int64_t reserved = std::min(want, room(seq));
    cache_.reserve(seq->table, seq->num_computed + reserved);
    result.chunks.push_back(
        {seq, n, spec || seq->num_computed + n == seq->len(), spec, spec ? reserved - n : 0});
    budget -= n;
    ++i;
  }
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < config_.max_batch) {
    Sequence* seq = waiting_.front();
    const int64_t n = std::min(prefill_target(seq), budget);
    if (!cache_.reserve(seq->table, n)) break;
    waiting_.pop_front();
    running_.push_back(seq);
    if (n > 0) result.chunks.push_back({seq, n, n == seq->len(), false, 0});
    budget -= n;
  }
  result.preempted.swap(preempted_);
  return result;
}

model::ForwardInput Scheduler::build_input(const std::vector<ScheduledChunk>& chunks,
                                           const std::vector<std::vector<int32_t>>& extra) const {
  model::ForwardInput in;
  for (const auto& c : chunks)
    in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(c.seq->table.blocks.size()));
  in.block_tables.assign(chunks.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
  for (size_t s = 0; s < chunks.size(); ++s) {
    const Sequence* seq = chunks[s].seq;
    std::copy(seq->table.blocks.begin(), seq->table.blocks.end(),
              in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
    std::vector<int32_t> tokens(seq->tokens.begin() + seq->num_computed,
                                seq->tokens.begin() + seq->num_computed + chunks[s].num_tokens);
    if (s < extra.size()) tokens.insert(tokens.end(), extra[s].begin(), extra[s].end());
    const int64_t first_logit = chunks[s].speculative ? 0 : static_cast<int64_t>(tokens.size()) - 1;
    for (size_t j = 0; j < tokens.size(); ++j) {
      in.tokens.push_back(tokens[j]);
      in.positions.push_back(static_cast<int32_t>(seq->num_computed + static_cast<int64_t>(j)));
      in.seq_of_token.push_back(static_cast<int32_t>(s));
      if (chunks[s].wants_logits && static_cast<int64_t>(j) >= first_logit)
        in.logit_rows.push_back(static_cast<int32_t>(in.tokens.size() - 1));
    }
  }
  return in;
}

std::vector<Sequence*> Scheduler::all() const {
  std::vector<Sequence*> out(running_.begin(), running_.end());
  out.insert(out.end(), waiting_.begin(), waiting_.end());
  return out;
}

}  // namespace ssd::runtime
