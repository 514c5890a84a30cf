#include "ssd_speculator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace ssd::runtime {

namespace {

CacheLookup lookup_of(SpecSource source) {
  switch (source) {
    case SpecSource::kHit: return CacheLookup::kHit;
    case SpecSource::kNeural: return CacheLookup::kNeuralFallback;
    case SpecSource::kFast: return CacheLookup::kFastFallback;
    case SpecSource::kStart: break;  // a sequence's first speculation came from no lookup
  }
  return CacheLookup::kNone;
}

}  // namespace

SsdSpeculator::SsdSpeculator(const EngineConfig& config, const TestingConfig& testing,
                             std::shared_ptr<model::Model> draft)
    : fault_truncated_q_(testing.fault_truncated_q),
      worker_(std::make_unique<SsdDraftWorker>(config, std::move(draft), testing)) {}

void SsdSpeculator::start(Sequence* seq) {
  Life& life = lives_[seq->id];
  SpecMessage m;
  m.kind = SpecMessage::Kind::kStart;
  m.id = seq->id;
  m.epoch = ++life.epoch;
  m.tokens = seq->tokens;
  m.params = seq->params;
  m.seed = seq->seed;
  m.lookahead = seq->lookahead;
  m.trees = seq->trees;
  life.started = true;
  life.told = seq->lookahead;
  outbox_.push_back(std::move(m));
}

bool SsdSpeculator::wants_speculation(const ScheduledChunk& c) const {
  if (!c.speculative) return false;
  auto it = lives_.find(c.seq->id);
  return it != lives_.end() && it->second.told > 0;
}

void SsdSpeculator::prefilling(Sequence* seq) {
  if (!lives_[seq->id].started) start(seq);
}

std::string SsdSpeculator::await_ready(const std::vector<ScheduledChunk>& chunks) {
  const auto t0 = std::chrono::steady_clock::now();
  auto missing = [&] {
    return std::any_of(chunks.begin(), chunks.end(),
                       [&](const ScheduledChunk& c) { return wants_speculation(c) && !ready_.count(c.seq->id); });
  };
  std::string lost;
  while (missing() && lost.empty()) {
    // Checked before collecting: once settled, what the worker sent is in its
    // outbox, and nothing else will come.
    std::string ended;
    const bool settled = worker_->settled(ended);
    std::vector<Speculation> got;
    worker_->collect(got, settled ? 0.0 : 1.0);
    for (auto& spec : got) {
      auto it = lives_.find(spec.id);
      if (it == lives_.end() || !it->second.started || it->second.epoch != spec.epoch) continue;
      ready_[spec.id] = std::move(spec);
    }
    if (worker_->interrupted()) lost = "the engine is shutting down";
    else if (settled && missing())
      lost = ended.empty() ? "the draft worker never answered for this sequence"
                           : "the draft worker " + ended;
  }
  wait_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return lost;
}

std::vector<DraftFailure> SsdSpeculator::propose(std::vector<ScheduledChunk>& chunks,
                                                 std::vector<Proposal>& proposals) {
  for (const auto& c : chunks)
    if (c.speculative && !lives_[c.seq->id].started) start(c.seq);
  flush();
  const std::string lost = await_ready(chunks);
  std::vector<DraftFailure> failures;
  std::vector<ScheduledChunk> kept;
  std::vector<Proposal> kept_proposals;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const ScheduledChunk& c = chunks[i];
    Proposal p;
    if (wants_speculation(c) && !ready_.count(c.seq->id)) {
      failures.push_back({c.seq, "no speculation: " + lost});
      continue;
    }
    if (wants_speculation(c)) {
      const Speculation& spec = ready_.at(c.seq->id);
      if (!spec.error.empty()) {
        failures.push_back({c.seq, spec.error});
        continue;
      }
      const auto drafted = static_cast<int64_t>(spec.tokens.size());
      const auto count = std::min<int64_t>(c.draft_tokens, drafted);
      p.tokens.assign(spec.tokens.begin(), spec.tokens.begin() + count);
      if (spec.q.defined()) {
        // The rows on the draft's device; verify copies them to the target's.
        p.q = spec.q;
        if (fault_truncated_q_) p.q = p.q.narrow(0, drafted - count, count);
      }
      p.one_hot = spec.one_hot;
      p.lookup = lookup_of(spec.source);
    }
    kept.push_back(c);
    kept_proposals.push_back(std::move(p));
  }
  chunks.swap(kept);
  proposals.swap(kept_proposals);
  return failures;
}

void SsdSpeculator::verified(Sequence* seq, const Proposal& proposal, int64_t accepted, int32_t bonus,
                             double verify_seconds) {
  SpecMessage m;
  m.kind = SpecMessage::Kind::kOutcome;
  m.id = seq->id;
  m.epoch = lives_[seq->id].epoch;
  m.accepted = accepted;
  m.proposed = static_cast<int64_t>(proposal.tokens.size());
  m.bonus = bonus;
  m.verify_seconds = verify_seconds;
  m.lookahead = seq->lookahead;
  m.trees = seq->trees;
  lives_[seq->id].told = seq->lookahead;
  ready_.erase(seq->id);
  outbox_.push_back(std::move(m));
}

void SsdSpeculator::release(Sequence* seq, bool finished) {
  auto it = lives_.find(seq->id);
  if (it == lives_.end()) return;
  if (it->second.started) {
    // An outcome queued this step for the same life is withdrawn: the worker
    // would only speculate for a sequence that is gone.
    std::erase_if(outbox_, [&](const SpecMessage& m) {
      return m.id == seq->id && m.kind == SpecMessage::Kind::kOutcome;
    });
    SpecMessage m;
    m.kind = SpecMessage::Kind::kRelease;
    m.id = seq->id;
    m.epoch = it->second.epoch;
    it->second.started = false;
    outbox_.push_back(std::move(m));
  }
  ready_.erase(seq->id);
  // A preempted sequence keeps its epoch, so its next life's answers are told apart.
  if (finished) lives_.erase(it);
}

void SsdSpeculator::flush() {
  if (!outbox_.empty()) worker_->post(std::move(outbox_));
  outbox_.clear();
}

void SsdSpeculator::stats(EngineStats& s) const { worker_->stats(s.draft, s.plan); }

void SsdSpeculator::interrupt() {
  if (worker_) worker_->interrupt();
}

void SsdSpeculator::stop() {
  if (worker_) worker_->stop();
}

}  // namespace ssd::runtime
