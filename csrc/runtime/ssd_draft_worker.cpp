#include "ssd_draft_worker.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>

#include "ssd/log.h"

namespace ssd::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t max_budget(const EngineConfig& c) {
  if (!c.fanout_list.empty()) {
    int64_t s = 0;
    for (int64_t f : c.fanout_list) s += f;
    return s;
  }
  return c.fanout_budget > 0 ? c.fanout_budget : 16;
}

std::unique_ptr<model::KvCache> make_draft_kv(const EngineConfig& config, const model::Model& model,
                                              const TestingConfig& testing) {
  // Room for the sequences plus a full tree of every sequence: each branch
  // grows by K positions from its fork, in blocks of its own from the fork's
  // block on.
  const int64_t bs = config.kv_block_size;
  const int64_t per_branch = 1 + (config.k + bs - 1) / bs;
  const int64_t tree_blocks =
      testing.tree_blocks > 0 ? testing.tree_blocks : config.max_batch * max_budget(config) * per_branch;
  return std::make_unique<model::KvCache>(model.shard_config(), config.num_kv_blocks() + config.max_batch + tree_blocks,
                                          bs, model.backend(), config.kv_cache_dtype_on(config.draft_device));
}

Speculation failure(RequestId id, uint64_t epoch, std::string error) {
  Speculation r;
  r.id = id;
  r.epoch = epoch;
  r.error = std::move(error);
  return r;
}

}  // namespace

/// One batch of messages being handled: its answers, the sequences still to
/// answer, and the counters it adds.
struct SsdDraftWorker::Batch {
  std::vector<Speculation> out;
  std::vector<DraftSequence*> misses, starts;
  std::vector<DraftSequence*> idle;  ///< no speculation wanted: the draft only catches up
  int64_t outcomes = 0;
  DraftCounters counters;

  /// Drops a sequence's draft state, and it from this batch's lists.
  void drop(const DraftSequence* s, SpeculationCache& sequences) {
    misses.erase(std::remove(misses.begin(), misses.end(), s), misses.end());
    starts.erase(std::remove(starts.begin(), starts.end(), s), starts.end());
    idle.erase(std::remove(idle.begin(), idle.end(), s), idle.end());
    sequences.drop(s->id);
  }
  /// Ends every sequence of `seqs` (this batch's misses or starts) with `error`.
  void fail(std::vector<DraftSequence*>& seqs, const std::string& error, SpeculationCache& sequences) {
    for (const DraftSequence* s : seqs) {
      out.push_back(failure(s->id, s->epoch, error));
      sequences.drop(s->id);
    }
    seqs.clear();
  }
};

SsdDraftWorker::SsdDraftWorker(const EngineConfig& config, std::shared_ptr<model::Model> draft,
                               const TestingConfig& testing)
    : config_(config),
      testing_(testing),
      model_(std::move(draft)),
      confidence_(confidence_fanout(config_)),
      kv_(make_draft_kv(config_, *model_, testing_)),
      pool_(std::make_unique<kernels::ThreadPool>(config_.draft_threads)),
      planner_(config_.k, config_.fanout_list, config_.fanout_budget, max_budget(config_)),
      sequences_(config_.k, *kv_),
      decoder_(config_, *model_, *kv_, *pool_, planner_),
      trees_(config_, *kv_, decoder_, planner_),
      fallback_(config_, planner_, &decoder_, testing_.auto_alternate) {
  thread_ = std::thread([this] { loop(); });
}

SsdDraftWorker::~SsdDraftWorker() { stop(); }

void SsdDraftWorker::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    wake_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  pool_.reset();
}

void SsdDraftWorker::post(std::vector<SpecMessage> messages) {
  if (messages.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& m : messages) inbox_.push_back(std::move(m));
  wake_.notify_all();
}

void SsdDraftWorker::collect(std::vector<Speculation>& out, double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  ready_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                  [this] { return !outbox_.empty() || stopping_ || interrupted_ || !ended_.empty(); });
  for (auto& s : outbox_) out.push_back(std::move(s));
  outbox_.clear();
}

void SsdDraftWorker::interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  ready_.notify_all();
}

bool SsdDraftWorker::interrupted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return interrupted_;
}

double SsdDraftWorker::busy_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_seconds_ + (busy_ ? since(busy_since_) : 0.0);
}

bool SsdDraftWorker::settled(std::string& why) const {
  std::lock_guard<std::mutex> lock(mu_);
  why = ended_;
  return !ended_.empty() || (inbox_.empty() && !busy_ && outbox_.empty());
}

void SsdDraftWorker::stats(DraftCounters& counters, DraftGauges& gauges) const {
  std::lock_guard<std::mutex> lock(mu_);
  counters = counters_;
  counters.draft_host_bytes = decoder_.host_bytes();
  gauges = gauges_;
}

void SsdDraftWorker::loop() {
  // The draft's forwards run on its own stream, never joining the target's.
  const std::shared_ptr<void> stream = model_->backend().thread_scope(model::StreamRole::draft);
  std::string ended = "stopped";
  for (;;) {
    std::vector<SpecMessage> messages;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !inbox_.empty(); });
      if (stopping_) break;
      messages.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
      inbox_.clear();
      busy_ = true;
      busy_since_ = Clock::now();
    }
    if (testing_.fault_worker_dies &&
        std::any_of(messages.begin(), messages.end(),
                    [](const SpecMessage& m) { return m.kind == SpecMessage::Kind::kOutcome; })) {
      ended = "died (testing.fault_worker_dies)";
      break;
    }
    try {
      handle(messages);
    } catch (const std::exception& e) {
      fail_batch(messages, std::string("draft worker failed: ") + e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    busy_seconds_ += since(busy_since_);
  }
  sequences_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  busy_ = false;
  ended_ = ended;
  ready_.notify_all();
}

void SsdDraftWorker::fail_batch(const std::vector<SpecMessage>& messages, const std::string& error) {
  // Unexpected: rather than leave the target waiting for these sequences, end them.
  std::vector<Speculation> failed;
  for (const auto& m : messages) {
    if (m.kind == SpecMessage::Kind::kRelease) continue;
    failed.push_back(failure(m.id, m.epoch, error));
    sequences_.drop(m.id);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : failed) outbox_.push_back(std::move(r));
  ready_.notify_all();
}

void SsdDraftWorker::handle(std::vector<SpecMessage>& messages) {
  Batch batch;
  read(messages, batch);
  if (testing_.draft_answer_delay_ms > 0 && batch.outcomes > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(testing_.draft_answer_delay_ms));
  plan_fanout(std::max<int64_t>(static_cast<int64_t>(batch.out.size() + batch.misses.size() + batch.starts.size()), 1));
  answer_misses(batch);
  answer_starts(batch);
  std::vector<DraftSequence*> to_tree;
  for (const auto& r : batch.out) {
    if (!r.error.empty()) continue;
    DraftSequence* s = sequences_.find(r.id);
    if (s != nullptr && !s->treed && s->trees) to_tree.push_back(s);
  }
  publish(batch);
  if (!testing_.always_miss && !to_tree.empty()) build_trees(to_tree);
  if (!batch.idle.empty()) catch_up(batch.idle);
}

void SsdDraftWorker::catch_up(const std::vector<DraftSequence*>& seqs) {
  // The target runs these sequences autoregressively for now: while it does,
  // the draft feeds their committed tokens (all but the last, which the next
  // drafting feeds), so speculation resumes without a long catch-up. It
  // waits for kCatchUpTokens of them: one forward over many rows costs about
  // what one over a row per sequence does.
  std::vector<DraftPath> paths;
  for (DraftSequence* s : seqs) {
    const int64_t end = static_cast<int64_t>(s->tokens.size()) - 1;
    if (s->computed + kCatchUpTokens > end) continue;
    paths.push_back(DraftPath::scoring(*s, s->table, s->computed,
                                       {s->tokens.begin() + s->computed, s->tokens.begin() + end},
                                       std::numeric_limits<int64_t>::max()));
  }
  if (paths.empty()) return;
  try {
    decoder_.decode(paths, fanout_, DraftForwards::kFallback);
  } catch (const std::exception& e) {
    // Only a head start is lost: the next drafting feeds what is missing.
    SSD_LOG_INFO("ssd draft: catching up on " << paths.size() << " sequences failed: " << e.what());
    return;
  }
  for (const DraftPath& p : paths) p.seq->computed = p.pos0 + static_cast<int64_t>(p.feed.size());
}

void SsdDraftWorker::read(std::vector<SpecMessage>& messages, Batch& batch) {
  for (auto& m : messages) {
    DraftSequence* s = sequences_.find(m.id);
    switch (m.kind) {
      case SpecMessage::Kind::kRelease:
        if (s != nullptr && s->epoch <= m.epoch) batch.drop(s, sequences_);
        break;
      case SpecMessage::Kind::kStart: {
        if (s != nullptr) batch.drop(s, sequences_);
        DraftSequence& started = sequences_.start(m);
        started.verify = m.lookahead;
        started.trees = m.trees;
        // A first round without speculation: the draft only prefills.
        (m.lookahead > 0 ? batch.starts : batch.idle).push_back(&started);
        break;
      }
      case SpecMessage::Kind::kOutcome:
        if (s == nullptr || s->epoch != m.epoch) break;  // an older life
        if (m.verify_seconds > 0) fallback_.observe_verify(m.verify_seconds);
        ++batch.outcomes;
        outcome(*s, m, batch);
        break;
    }
  }
}

void SsdDraftWorker::outcome(DraftSequence& s, const SpecMessage& m, Batch& batch) {
  const int64_t accepted = std::clamp<int64_t>(m.accepted, 0, static_cast<int64_t>(s.spec.size()));
  // A round without speculation (lookahead 0) teaches the estimates nothing.
  const bool speculated = !s.spec.empty() && m.proposed > 0;
  const bool asked_tree = s.trees;
  if (speculated) {
    trees_.observe_outcome(s, accepted, m.proposed, m.bonus);
    fallback_.observe_emitted(s.source, accepted, asked_tree);
  }
  sequences_.commit(s, accepted, m.bonus);
  fallback_.score_shadows(s, batch.counters);
  // The next round: what the target verifies of it, and whether it wants a tree.
  s.verify = m.lookahead;
  s.trees = m.trees;
  Speculation answer;
  const bool wanted = m.lookahead > 0;
  const bool hit = wanted && !testing_.always_miss && sequences_.take_hit(s, accepted, m.bonus, answer);
  if (wanted && speculated && asked_tree) fallback_.observe_lookup(hit);
  sequences_.free_tree(s);
  if (hit) {
    batch.out.push_back(std::move(answer));
    batch.counters.kv_commits += 1;
    return;
  }
  s.spec.clear();
  s.ranked.clear();
  (wanted ? batch.misses : batch.idle).push_back(&s);
}

void SsdDraftWorker::plan_fanout(int64_t sequences) {
  const int64_t before = planner_.budget();
  fanout_ = planner_.plan(sequences);
  if (planner_.budget() != before)
    SSD_LOG_DEBUG("ssd fan-out budget: " << before << " -> " << planner_.budget() << " (auto: the tree of " << sequences
                                        << " sequences sized to one verify forward, last "
                                        << fallback_.verify_seconds() * 1e3 << " ms)");
}

void SsdDraftWorker::answer_misses(Batch& batch) {
  if (batch.misses.empty()) return;
  // Rounds without trees (the adaptive policy's sd-like drafting) draft with
  // the draft model: the policy's estimates are the draft's.
  const bool treeless = std::none_of(batch.misses.begin(), batch.misses.end(),
                                     [](const DraftSequence* s) { return s->trees; });
  const FallbackKind kind = treeless ? FallbackKind::kNeural : fallback_.choose(batch.outcomes);
  // The fast kind's tokens per round, learnt beside the neural one.
  if (kind == FallbackKind::kNeural) fallback_.shadow(batch.misses);
  const auto t0 = Clock::now();
  try {
    fallback_.draft(kind, source_of(kind), batch.misses, fanout_, batch.out);
  } catch (const std::exception& e) {
    batch.fail(batch.misses, std::string("draft fallback failed: ") + e.what(), sequences_);
    return;
  }
  const double seconds = since(t0);
  fallback_.observe_run(kind, seconds, !treeless);
  batch.counters.fallback_seconds += seconds;
  batch.counters.fallback_batches += 1;
  if (kind == FallbackKind::kNeural) {
    batch.counters.neural_fallback_seconds += seconds;
    batch.counters.neural_fallback_batches += 1;
  }
}

void SsdDraftWorker::answer_starts(Batch& batch) {
  // A first draft comes with the draft's prefill: no fallback, not timed as one.
  if (batch.starts.empty()) return;
  try {
    fallback_.draft(FallbackKind::kNeural, SpecSource::kStart, batch.starts, fanout_, batch.out);
  } catch (const std::exception& e) {
    batch.fail(batch.starts, std::string("draft prefill failed: ") + e.what(), sequences_);
  }
}

void SsdDraftWorker::publish(Batch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!confidence_) gauges_.fanout = fanout_;
  gauges_.fanout_budget = planner_.budget();
  gauges_.acceptance_estimate = planner_.acceptance();
  gauges_.miss_exponent = planner_.miss_exponent();
  gauges_.fallback_neural_estimate = fallback_.tokens_estimate(FallbackKind::kNeural);
  gauges_.fallback_fast_estimate = fallback_.tokens_estimate(FallbackKind::kFast);
  counters_ += batch.counters;
  for (auto& r : batch.out) outbox_.push_back(std::move(r));
  ready_.notify_all();
}

void SsdDraftWorker::build_trees(const std::vector<DraftSequence*>& seqs) {
  TreeReport report;
  try {
    report = trees_.build(seqs, fanout_, fallback_.verify_seconds());
  } catch (const std::exception& e) {
    // A tree that cannot be built only costs hits: its outcomes fall back.
    for (DraftSequence* s : seqs) sequences_.free_tree(*s);
    SSD_LOG_INFO("ssd tree: not built for " << seqs.size() << " sequences, their outcomes fall back: " << e.what());
    return;
  }
  fallback_.observe_tree(report.seconds);
  SSD_LOG_DEBUG("ssd tree: " << report.sequences << " sequences, " << report.branches << " branches, fork points "
                             << report.fork_seconds * 1e3 << " ms, branches " << report.branch_seconds * 1e3
                             << " ms");
  std::lock_guard<std::mutex> lock(mu_);
  if (confidence_) gauges_.fanout = report.per_fork;
  counters_.draft_rounds += 1;
  counters_.tree_branches += report.branches;
  if (report.branches < report.planned) {
    counters_.partial_trees += 1;
    counters_.branches_dropped += report.planned - report.branches;
  }
  counters_.draft_round_seconds += report.seconds;
}

}  // namespace ssd::runtime
