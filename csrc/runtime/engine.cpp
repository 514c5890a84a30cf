// The engine: the public API (enqueue, await, cancel, shutdown, stats) and
// one loop on its own thread, the same for every mode:
//   schedule -> (speculator proposes) -> one target forward -> postprocess
// where postprocess draws the target's token after a prefill, or verifies a
// speculative chunk's proposals, on the target's device (target_round.h), and
// tells the speculator the outcome. Mode-specific state lives in the
// Speculator (speculator.h).
#include "ssd/engine.h"

#include <algorithm>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "../kernels/cpu/thread_pool.h"
#include "ssd/log.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "adaptive_policy.h"
#include "scheduler.h"
#include "speculator.h"
#include "target_round.h"
#include "verification.h"

namespace ssd {

using runtime::Clock;
using runtime::Proposal;
using runtime::ScheduledChunk;
using runtime::Sequence;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

class Engine::Impl {
 public:
  Impl(const EngineConfig& config, std::shared_ptr<model::Model> target, std::vector<int32_t> eos,
       std::shared_ptr<model::Model> draft, const TestingConfig& testing)
      : config_(config), testing_(testing), model_(std::move(target)), eos_(std::move(eos)) {
    config_.validate(testing_);
    if (!model_) throw std::invalid_argument("target model is null");
    check_placement("target_device", *model_, config_.target_device);
    if (model_->tensor_parallel_size() != config_.tensor_parallel_size || model_->tensor_parallel_rank() != 0)
      throw std::invalid_argument("tensor_parallel_size " + std::to_string(config_.tensor_parallel_size) +
                                  ": the target is rank " + std::to_string(model_->tensor_parallel_rank()) + " of " +
                                  std::to_string(model_->tensor_parallel_size()) +
                                  " (the engine runs rank 0 of a group of that size)");
    check_draft(draft.get());
    config_.resolve(model_->config(), draft ? &draft->config() : nullptr, testing_);
    SSD_LOG_INFO("engine: mode " << config_.mode << ", max_model_len " << config_.max_model_len << ", KV cache "
                                 << config_.kv_capacity_tokens << " tokens");
    vocab_ = model_->config().vocab_size;
    round_ = std::make_unique<runtime::TargetRound>(model_->backend(), vocab_, testing_, coupling_);
    cache_ = std::make_unique<model::KvCache>(model_->shard_config(), config_.num_kv_blocks(), config_.kv_block_size,
                                            model_->backend(), config_.kv_cache_dtype_on(config_.target_device));
    speculator_ = runtime::make_speculator(config_, testing_, std::move(draft));
    scheduler_ = std::make_unique<runtime::Scheduler>(config_, *cache_, speculator_ ? config_.k : 0);
    pool_ = std::make_unique<kernels::ThreadPool>(config_.target_threads);
    if (config_.tensor_parallel_size > 1) model_->lead(true);
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() { shutdown(); }

  // Validates all requests (messages name the index when `indexed`), then
  // queues them under one lock.
  std::vector<RequestId> queue(std::vector<Request> requests, bool indexed) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (size_t i = 0; i < requests.size(); ++i) {
      try {
        seqs.push_back(make_sequence(std::move(requests[i])));
      } catch (const std::invalid_argument& e) {
        if (!indexed) throw;
        throw std::invalid_argument("request " + std::to_string(i) + ": " + e.what());
      }
    }
    std::vector<RequestId> ids;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw std::runtime_error("engine is shut down");
    if (!failure_.empty()) throw std::runtime_error("engine failed: " + failure_);
    for (auto& seq : seqs) {
      seq->seed = seq->params.has_seed ? seq->params.seed : (uint64_t{seed_source_()} << 32) | seed_source_();
      seq->metrics.seed = seq->seed;
      seq->id = next_id_++;
      ids.push_back(seq->id);
      inbox_.push_back(std::move(seq));
    }
    wake_.notify_all();
    return ids;
  }

  std::vector<Response> await_responses(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                    [this] { return !outbox_.empty() || stopped_; });
    std::vector<Response> out;
    out.swap(outbox_);
    return out;
  }

  void cancel(RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(id);
    wake_.notify_all();
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      wake_.notify_all();
    }
    // A step waiting on the draft worker gives up rather than delay the stop.
    if (speculator_) speculator_->interrupt();
    if (thread_.joinable()) thread_.join();
    pool_.reset();  // no thread outlives shutdown
    if (speculator_) speculator_->stop();
    if (config_.tensor_parallel_size > 1 && !followers_stopped_ && failure().empty()) {
      followers_stopped_ = true;
      try {  // a rank that is gone cannot be told; its process ends with its connection
        model_->stop_followers();
      } catch (const std::exception& e) {
        SSD_LOG_WARNING("engine: stopping the tensor-parallel followers failed: " << e.what());
      }
    }
  }

  EngineStats stats() const {
    EngineStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = stats_;
    }
    if (speculator_) speculator_->stats(s);
    s.engine.random_token_acceptance = 1.0 / static_cast<double>(vocab_);
    return s;
  }

  const EngineConfig& config() const { return config_; }

  std::string failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

 private:
  // A tensor-parallel target's followers wait for rank 0 no longer than the
  // group's timeout: while the engine leads a working group, it wakes at
  // least this often and pings them when no forward has.
  bool leading() const { return config_.tensor_parallel_size > 1 && failure_.empty(); }  // mu_ held
  double ping_interval_s() const { return config_.tensor_parallel_timeout_s / 4; }

  void keep_followers(std::vector<Response>& responses) {
    if (config_.tensor_parallel_size == 1 || !failure().empty()) return;
    try {
      model_->ping_followers(ping_interval_s());
    } catch (const std::exception& e) {
      fail(std::string("tensor parallelism: a rank is lost: ") + e.what(), responses);
    }
  }

  // The ranks of a tensor-parallel target are out of step for good: every
  // request known ends with `why`, and later ones are refused (queue).
  void fail(const std::string& why, std::vector<Response>& responses) {
    SSD_LOG_ERROR("engine failed: " << why << " (every request ends with an error; new ones are refused)");
    {
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = why;
      for (auto& seq : inbox_) live_.emplace(seq->id, std::move(seq));
      inbox_.clear();
    }
    std::vector<Sequence*> pending;
    for (auto& [id, seq] : live_) pending.push_back(seq.get());
    for (Sequence* seq : pending) finish(seq, FinishReason::kError, why, responses);
  }

  bool stopping() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }

  std::unique_ptr<Sequence> make_sequence(Request request) const {
    request.params.validate(vocab_);
    if (request.prompt.empty()) throw std::invalid_argument("prompt: must contain at least one token");
    for (int32_t id : request.prompt)
      if (id < 0 || id >= vocab_)
        throw std::invalid_argument("prompt: token id " + std::to_string(id) +
                                    " is outside the vocabulary (size " + std::to_string(vocab_) + ")");
    const auto n = static_cast<int64_t>(request.prompt.size());
    if (n >= config_.max_model_len)
      throw std::invalid_argument("prompt: " + std::to_string(n) + " tokens do not fit max_model_len " +
                                  std::to_string(config_.max_model_len) +
                                  " (at least one token must be generated)");
    auto seq = std::make_unique<Sequence>();
    seq->params = request.params;
    seq->prompt_len = n;
    seq->tokens = std::move(request.prompt);
    seq->enqueued = Clock::now();
    seq->metrics.prompt_tokens = n;
    seq->lookahead = config_.k;  // until the policy plans its first round
    return seq;
  }

  // A model is built for one device and backend; the config must name them.
  void check_placement(const char* field, const model::Model& m, const std::string& device) const {
    if (m.device() != model::canonical_device(device))
      throw std::invalid_argument(std::string(field) + ": the model was built for '" + m.device() + "', not '" +
                                  device + "'");
    if (config_.backend == "aten" && m.backend().name() != "aten")
      throw std::invalid_argument(std::string("backend: 'aten', but the model of ") + field + " was built for the '" +
                                  m.backend().name() + "' backend");
  }

  void check_draft(const model::Model* draft) const {
    if (config_.mode == "ar") {
      if (draft) throw std::invalid_argument("mode: 'ar' takes no draft model (use 'sd')");
      return;
    }
    if (!draft) throw std::invalid_argument("mode: '" + config_.mode + "' needs a draft model");
    check_placement("draft_device", *draft, config_.draft_device);
    const int64_t v_tgt = model_->config().vocab_size, v_dft = draft->config().vocab_size;
    if (v_tgt != v_dft)
      throw std::invalid_argument("draft vocabulary (" + std::to_string(v_dft) + " tokens) differs from the target's (" +
                                  std::to_string(v_tgt) + " tokens): they must share one tokenizer");
  }

  void loop() {
    // The target's forwards and rounds run on its own stream.
    const std::shared_ptr<void> stream = model_->backend().thread_scope(model::StreamRole::target);
    {  // the followers have waited for rank 0 since they joined the group
      std::vector<Response> responses;
      keep_followers(responses);
      publish(std::move(responses));
    }
    for (;;) {
      std::vector<std::unique_ptr<Sequence>> incoming;
      std::vector<RequestId> cancels;
      {
        std::unique_lock<std::mutex> lock(mu_);
        const auto ready = [this] { return stopping_ || !inbox_.empty() || !cancels_.empty() || !scheduler_->idle(); };
        if (leading())
          wake_.wait_for(lock, std::chrono::duration<double>(ping_interval_s()), ready);
        else
          wake_.wait(lock, ready);
        if (stopping_) break;
        incoming.swap(inbox_);
        cancels.swap(cancels_);
      }
      for (auto& seq : incoming) {
        scheduler_->add(seq.get());
        live_.emplace(seq->id, std::move(seq));
      }
      std::vector<Response> responses;
      for (RequestId id : cancels) {
        auto it = live_.find(id);
        if (it != live_.end()) finish(it->second.get(), FinishReason::kCancelled, "", responses);
      }
      step(responses);
      keep_followers(responses);
      refresh_gauges();
      publish(std::move(responses));
    }
    cancel_everything();
  }

  // Shutdown: every request still known ends as cancelled.
  void cancel_everything() {
    std::vector<Response> responses;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& seq : inbox_) live_.emplace(seq->id, std::move(seq));
      inbox_.clear();
    }
    std::vector<Sequence*> pending;
    for (auto& [id, seq] : live_) pending.push_back(seq.get());
    for (Sequence* seq : pending) finish(seq, FinishReason::kCancelled, "", responses);
    publish(std::move(responses));
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    ready_.notify_all();
  }

  // schedule -> propose -> forward -> postprocess.
  void step(std::vector<Response>& responses) {
    const auto t_step = Clock::now();
    runtime::ScheduleResult plan = scheduler_->schedule();
    for (Sequence* seq : plan.preempted)
      if (speculator_) speculator_->release(seq, false);
    for (Sequence* seq : plan.failed) finish(seq, FinishReason::kError, plan.failure, responses);
    // A sequence's speculation starts with its prefill's first chunk, so the
    // draft side prefills the prompt beside the target instead of after it.
    if (speculator_)
      for (const auto& c : plan.chunks)
        if (!c.speculative && c.seq->num_computed == 0) {
          policy_.first_round(c.seq);
          speculator_->prefilling(c.seq);
        }
    std::vector<Proposal> proposals(plan.chunks.size());
    // Each round verifies what its sequence's lookahead (decided before this step) says.
    std::vector<Sequence*> decoding;
    for (auto& c : plan.chunks)
      if (c.speculative) {
        c.draft_tokens = std::min(c.draft_tokens, c.seq->lookahead);
        decoding.push_back(c.seq);
      }
    if (speculator_ && !decoding.empty()) {
      EngineStats draft_side;
      speculator_->stats(draft_side);
      policy_.plan(decoding, draft_side.draft);
    }
    if (speculator_ && !plan.chunks.empty())
      for (const auto& f : speculator_->propose(plan.chunks, proposals))
        finish(f.seq, stopping() ? FinishReason::kCancelled : FinishReason::kError, f.error, responses);
    if (plan.chunks.empty()) {
      if (speculator_) speculator_->flush();
      return;
    }
    std::vector<std::vector<int32_t>> extra(plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      for (int64_t t : proposals[i].tokens) extra[i].push_back(static_cast<int32_t>(t));
    const model::ForwardInput input = scheduler_->build_input(plan.chunks, extra);
    const double draft_busy0 = speculator_ ? speculator_->draft_busy_seconds() : 0.0;
    const auto t0 = Clock::now();
    at::Tensor logits;
    try {
      logits = model_->forward_device(input, *cache_, *pool_);
    } catch (const std::exception& e) {
      const std::string why = std::string("forward failed: ") + e.what();
      // A tensor-parallel group's ranks may be out of step (one sent, another did not): nothing later
      // can be trusted, so every request ends, not only this step's.
      if (config_.tensor_parallel_size > 1)
        fail("tensor parallelism: " + why, responses);
      else
        for (const auto& c : plan.chunks) finish(c.seq, FinishReason::kError, why, responses);
      if (speculator_) speculator_->flush();
      return;
    }
    const double forward_s = seconds_since(t0);
    policy_.observe_forward(static_cast<int64_t>(input.tokens.size()), forward_s,
                            speculator_ ? speculator_->draft_busy_seconds() - draft_busy0 : 0.0);
    const int64_t emitted = postprocess(plan.chunks, proposals, logits, forward_s, responses);
    if (speculator_) speculator_->flush();
    policy_.observe_step(seconds_since(t_step), decoding.size() == plan.chunks.size());
    record_step(plan, static_cast<int64_t>(input.tokens.size()), emitted, forward_s, t_step);
  }

  void record_step(const runtime::ScheduleResult& plan, int64_t forward_tokens, int64_t emitted, double forward_s,
                   Clock::time_point t_step) {
    const bool verified = std::any_of(plan.chunks.begin(), plan.chunks.end(),
                                      [](const ScheduledChunk& c) { return c.speculative; });
    std::lock_guard<std::mutex> lock(mu_);
    StepCounters& c = stats_.steps;
    c.steps += 1;
    c.forward_tokens += forward_tokens;
    c.generated_tokens += emitted;
    c.forward_seconds += forward_s;
    if (verified) {
      c.verify_steps += 1;
      c.verify_seconds += forward_s;
    }
    c.target_wait_seconds += speculator_ ? speculator_->wait_seconds() : 0.0;
    c.round_host_bytes = round_->host_bytes();
    c.active_seconds += seconds_since(t_step);
    policy_.stats(stats_);
    stats_.engine.peak_batch = std::max<int64_t>(stats_.engine.peak_batch, static_cast<int64_t>(plan.chunks.size()));
  }

  // After every pass of the loop (steps, cancellations), so stats() is current.
  void refresh_gauges() {
    std::lock_guard<std::mutex> lock(mu_);
    EngineGauges& g = stats_.engine;
    g.num_preemptions = scheduler_->num_preemptions();
    g.num_running = scheduler_->num_running();
    g.num_waiting = scheduler_->num_waiting();
    g.kv_blocks_total = cache_->num_blocks();
    g.kv_blocks_free = cache_->num_free_blocks();
  }

  // Draws or verifies every chunk's rows on the target's device, then
  // applies the outcomes in chunk order; returns the tokens emitted.
  int64_t postprocess(const std::vector<ScheduledChunk>& chunks, const std::vector<Proposal>& proposals,
                      const at::Tensor& logits, double forward_s, std::vector<Response>& responses) {
    std::vector<runtime::RoundItem> items;
    std::vector<int64_t> item_of(chunks.size(), -1);
    int64_t row = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (!chunks[i].speculative && !chunks[i].wants_logits) continue;
      item_of[i] = static_cast<int64_t>(items.size());
      const Proposal* proposal = chunks[i].speculative ? &proposals[i] : nullptr;
      items.push_back({chunks[i].seq, proposal, row});
      row += 1 + (proposal ? static_cast<int64_t>(proposal->tokens.size()) : 0);
    }
    std::vector<runtime::RoundOutcome> outcomes;
    try {
      outcomes = round_->run(logits, items);
    } catch (const std::exception& e) {
      for (size_t i = 0; i < chunks.size(); ++i) {
        if (item_of[i] >= 0)
          finish(chunks[i].seq, FinishReason::kError, std::string("sampling failed: ") + e.what(), responses);
        else
          chunks[i].seq->num_computed += chunks[i].num_tokens;
      }
      return 0;
    }
    int64_t emitted = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      Sequence* seq = chunks[i].seq;
      if (chunks[i].speculative) {
        emitted += run_round(seq, proposals[i], outcomes[item_of[i]], forward_s, responses);
        continue;
      }
      seq->num_computed += chunks[i].num_tokens;
      if (item_of[i] < 0) continue;
      runtime::RoundOutcome& o = outcomes[item_of[i]];
      if (!o.error.empty()) {
        finish(seq, FinishReason::kError, "sampling failed: " + o.error, responses);
        continue;
      }
      append_token(seq, o.verdict.bonus, std::move(o.logprobs), responses);
      ++emitted;
    }
    return emitted;
  }

  // One speculative round of `seq` after its verification: rolls the KV back
  // to what the sequence keeps, tells the speculator, and appends the
  // accepted tokens and the bonus. Returns the tokens emitted.
  int64_t run_round(Sequence* seq, const Proposal& proposal, runtime::RoundOutcome& outcome, double forward_s,
                    std::vector<Response>& responses) {
    const int64_t start = seq->len();  // position of the first proposal
    const RequestId id = seq->id;      // seq is gone once it finishes
    if (!outcome.error.empty()) {
      finish(seq, FinishReason::kError, "sampling failed: " + outcome.error, responses);
      return 0;
    }
    const runtime::Verdict verdict = outcome.verdict;
    // The KV of the verified token and the accepted proposals stays.
    seq->num_computed = start + verdict.accepted;
    cache_->truncate(seq->table, seq->num_computed);
    // The next round's lookahead, from this round's outcome: the worker hears it with the outcome.
    policy_.after_round(seq, static_cast<int64_t>(proposal.tokens.size()), verdict.accepted, proposal.lookup);
    speculator_->verified(seq, proposal, verdict.accepted, verdict.bonus, forward_s);
    int64_t emitted = 0;
    bool finished = false;
    for (int64_t i = 0; i <= verdict.accepted && !finished; ++i) {
      const auto token = static_cast<int32_t>(i < verdict.accepted ? proposal.tokens[i] : verdict.bonus);
      ++emitted;
      std::vector<TokenLogprobs> logprobs;
      if (i < static_cast<int64_t>(outcome.logprobs.size())) logprobs.push_back(std::move(outcome.logprobs[i]));
      finished = append_token(seq, token, std::move(logprobs), responses);
    }
    add_round_counters(finished ? nullptr : seq, id,
                       runtime::round_counters(proposal, verdict.accepted, emitted, finished), responses);
    return emitted;
  }

  // seq: null when the round finished it (its final response is amended instead).
  void add_round_counters(Sequence* seq, RequestId id, const SpecCounters& d, std::vector<Response>& responses) {
    if (seq == nullptr) {
      for (auto it = responses.rbegin(); it != responses.rend(); ++it)
        if (it->id == id && it->finished) {
          it->metrics.spec += d;
          break;
        }
    } else {
      seq->metrics.spec += d;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.spec += d;
  }

  // Appends a token (with its log-probabilities when the request asked) and
  // applies the stop rules; true when the request finished.
  bool append_token(Sequence* seq, int32_t token, std::vector<TokenLogprobs> logprobs,
                    std::vector<Response>& responses) {
    seq->tokens.push_back(token);
    if (seq->generated() == 1) seq->metrics.time_to_first_token = seconds_since(seq->enqueued);
    const auto& p = seq->params;
    FinishReason reason = FinishReason::kNone;
    const bool is_eos = std::find(eos_.begin(), eos_.end(), token) != eos_.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
    if ((is_eos && !p.ignore_eos) || is_stop) reason = FinishReason::kStop;
    else if (seq->generated() >= p.max_tokens || seq->len() >= config_.max_model_len) reason = FinishReason::kLength;
    if (reason != FinishReason::kNone) {
      finish(seq, reason, "", responses, {token}, std::move(logprobs));
      return true;
    }
    Response r;
    r.id = seq->id;
    r.tokens = {token};
    r.logprobs = std::move(logprobs);
    responses.push_back(std::move(r));
    return false;
  }

  void finish(Sequence* seq, FinishReason reason, const std::string& error, std::vector<Response>& responses,
              std::vector<int32_t> tokens = {}, std::vector<TokenLogprobs> logprobs = {}) {
    if (speculator_) speculator_->release(seq, true);
    scheduler_->remove(seq);
    Response r;
    r.id = seq->id;
    r.tokens = std::move(tokens);
    r.logprobs = std::move(logprobs);
    r.finished = true;
    r.finish_reason = reason;
    r.error = error;
    r.metrics = seq->metrics;
    r.metrics.generated_tokens = seq->generated();
    r.metrics.finish_time = seconds_since(seq->enqueued);
    responses.push_back(std::move(r));
    live_.erase(seq->id);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps.num_finished += 1;
  }

  void publish(std::vector<Response> responses) {
    if (responses.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : responses) outbox_.push_back(std::move(r));
    ready_.notify_all();
  }

  EngineConfig config_;
  TestingConfig testing_;
  std::shared_ptr<model::Model> model_;
  std::vector<int32_t> eos_;
  int64_t vocab_ = 0;
  bool followers_stopped_ = false;
  std::string failure_;  ///< why the engine failed (fail()); empty while it works (mu_)
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<runtime::Speculator> speculator_;  // null in mode "ar"
  std::unique_ptr<runtime::Scheduler> scheduler_;
  std::unique_ptr<kernels::ThreadPool> pool_;
  runtime::AdaptivePolicy policy_{config_, testing_};
  runtime::Coupling coupling_ = runtime::Coupling::of(config_, testing_);
  std::unique_ptr<runtime::TargetRound> round_;  // engine thread only
  std::random_device seed_source_;
  std::map<RequestId, std::unique_ptr<Sequence>> live_;  // engine thread only

  mutable std::mutex mu_;
  std::condition_variable wake_, ready_;
  std::vector<std::unique_ptr<Sequence>> inbox_;
  std::vector<RequestId> cancels_;
  std::vector<Response> outbox_;
  EngineStats stats_;
  RequestId next_id_ = 1;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

Engine::Engine(const EngineConfig& config, std::shared_ptr<model::Model> target, std::vector<int32_t> eos_token_ids,
               std::shared_ptr<model::Model> draft, const TestingConfig& testing)
    : impl_(std::make_unique<Impl>(config, std::move(target), std::move(eos_token_ids), std::move(draft), testing)) {}
Engine::~Engine() = default;
RequestId Engine::enqueue(Request request) {
  std::vector<Request> one;
  one.push_back(std::move(request));
  return impl_->queue(std::move(one), false).front();
}
std::vector<RequestId> Engine::enqueue_batch(std::vector<Request> requests) {
  return impl_->queue(std::move(requests), true);
}
std::vector<Response> Engine::await_responses(double timeout_s) { return impl_->await_responses(timeout_s); }
void Engine::cancel(RequestId id) { impl_->cancel(id); }
void Engine::shutdown() { impl_->shutdown(); }
EngineStats Engine::stats() const { return impl_->stats(); }
std::string Engine::failure() const { return impl_->failure(); }
const EngineConfig& Engine::config() const { return impl_->config(); }

}  // namespace ssd
