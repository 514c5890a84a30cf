#include "ssd/engine.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "../kernels/cpu/sampling.h"
#include "../kernels/cpu/thread_pool.h"
#include "../model/kv_cache.h"
#include "../model/model.h"
#include "../kernels/cpu/verify.h"
#include "drafter.h"
#include "scheduler.h"
#include "ssd_draft_worker.h"

namespace ssd {

using runtime::Clock;
using runtime::Sequence;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

/// The proposals one speculative chunk verifies this round.
struct Proposal {
  std::vector<int64_t> tokens;  ///< the count proposals verified
  const float* q = nullptr;     ///< [count, vocab] exact rows; unused when one_hot
  bool one_hot = false;
  int source = -1;              ///< ssd: a runtime::SpecSource; -1 in sd
};

struct RoundResult {
  int64_t emitted = 0;
  int64_t accepted = 0;
  int32_t bonus = 0;
  bool finished = false;
};

}  // namespace

class Engine::Impl {
 public:
  Impl(const EngineConfig& config, std::shared_ptr<model::Model> target, std::vector<int32_t> eos,
       std::shared_ptr<model::Model> draft, const TestingConfig& testing)
      : config_(config), testing_(testing), model_(std::move(target)), eos_(std::move(eos)) {
    config_.validate();
    if (!model_) throw std::invalid_argument("target model is null");
    check_draft(draft.get());
    cache_ = std::make_unique<model::KvCache>(model_->config(), config_.num_kv_blocks(),
                                              config_.kv_block_size);
    int64_t lookahead = 0;
    if (draft) {
      if (config_.mode == "ssd")
        worker_ = std::make_unique<runtime::SsdDraftWorker>(config_, std::move(draft), testing_);
      else
        drafter_ = std::make_unique<runtime::Drafter>(std::move(draft), config_.num_kv_blocks(),
                                                      config_.kv_block_size, config_.draft_threads,
                                                      config_.draft_matmul_min_rows);
      lookahead = config_.k;
    }
    scheduler_ = std::make_unique<runtime::Scheduler>(config_, *cache_, lookahead,
                                                      drafter_ ? &drafter_->cache() : nullptr);
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() { shutdown(); }

  RequestId enqueue(Request request) {
    std::vector<Request> one;
    one.push_back(std::move(request));
    return queue(std::move(one), false).front();
  }

  std::vector<RequestId> enqueue_batch(std::vector<Request> requests) { return queue(std::move(requests), true); }

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

  std::unique_ptr<Sequence> make_sequence(Request request) const {
    const int64_t vocab = model_->config().vocab_size;
    request.params.validate(vocab);
    if (request.prompt.empty()) throw std::invalid_argument("prompt: must contain at least one token");
    for (int32_t id : request.prompt)
      if (id < 0 || id >= vocab)
        throw std::invalid_argument("prompt: token id " + std::to_string(id) +
                                    " is outside the vocabulary (size " + std::to_string(vocab) + ")");
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
    return seq;
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
    if (thread_.joinable()) thread_.join();
    pool_.reset();  // no thread outlives shutdown
    drafter_.reset();
    if (worker_) worker_->stop();
  }

  EngineStats stats() const {
    EngineStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = stats_;
    }
    if (worker_) worker_->stats(s.draft, s.plan);
    s.engine.random_token_acceptance = 1.0 / static_cast<double>(model_->config().vocab_size);
    return s;
  }

  void check_draft(const model::Model* draft) const {
    if (config_.mode == "ar") {
      if (draft) throw std::invalid_argument("mode: 'ar' takes no draft model (use 'sd')");
      return;
    }
    if (!draft) throw std::invalid_argument("mode: '" + config_.mode + "' needs a draft model");
    const int64_t v_tgt = model_->config().vocab_size, v_dft = draft->config().vocab_size;
    if (v_tgt != v_dft)
      throw std::invalid_argument("draft vocabulary (" + std::to_string(v_dft) +
                                  " tokens) differs from the target's (" + std::to_string(v_tgt) +
                                  " tokens): they must share one tokenizer");
  }

  const EngineConfig& config() const { return config_; }

 private:
  void loop() {
    for (;;) {
      std::vector<std::unique_ptr<Sequence>> incoming;
      std::vector<RequestId> cancels;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [this] {
          return stopping_ || !inbox_.empty() || !cancels_.empty() || !scheduler_->idle();
        });
        if (stopping_) break;
        incoming.swap(inbox_);
        cancels.swap(cancels_);
      }
      for (auto& seq : incoming) {
        scheduler_->add(seq.get());
        live_.emplace(seq->id, std::move(seq));
      }
      std::vector<Response> responses;
      for (RequestId id : cancels) finish_cancelled(id, responses);
      step(responses);
      publish(std::move(responses));
    }
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

  void step(std::vector<Response>& responses) {
    const auto t_step = Clock::now();
    runtime::ScheduleResult plan = scheduler_->schedule();
    for (Sequence* seq : plan.preempted) release_draft(seq);
    for (Sequence* seq : plan.failed) finish(seq, FinishReason::kError, plan.failure, responses);
    if (plan.chunks.empty()) {
      flush_to_draft();
      return;
    }
    std::vector<Proposal> proposals(plan.chunks.size());
    runtime::DraftBatch drafts;  // sd: owns the q rows the proposals point at
    double wait_s = 0.0;
    if (worker_) {
      wait_s = await_speculations(plan.chunks, proposals, responses);
    } else if (!draft_sync(plan.chunks, proposals, drafts, responses)) {
      return;
    }
    if (plan.chunks.empty()) return;
    std::vector<std::vector<int32_t>> extra(plan.chunks.size());
    for (size_t i = 0; i < plan.chunks.size(); ++i)
      for (int64_t t : proposals[i].tokens) extra[i].push_back(static_cast<int32_t>(t));
    const model::ForwardInput input = scheduler_->build_input(plan.chunks, extra);
    const auto t0 = Clock::now();
    at::Tensor logits;
    try {
      logits = model_->forward(input, *cache_, *pool_);
    } catch (const std::exception& e) {
      for (const auto& c : plan.chunks)
        finish(c.seq, FinishReason::kError, std::string("forward failed: ") + e.what(), responses);
      flush_to_draft();
      return;
    }
    const double forward_s = seconds_since(t0);
    bool any_spec = false;
    for (const auto& c : plan.chunks) any_spec = any_spec || c.speculative;
    const int64_t emitted = postprocess(plan.chunks, proposals, logits, forward_s, responses);
    flush_to_draft();
    std::lock_guard<std::mutex> lock(mu_);
    StepCounters& c = stats_.steps;
    c.steps += 1;
    c.forward_tokens += static_cast<int64_t>(input.tokens.size());
    c.generated_tokens += emitted;
    c.forward_seconds += forward_s;
    if (any_spec) {
      c.verify_steps += 1;
      c.verify_seconds += forward_s;
    }
    c.target_wait_seconds += wait_s;
    c.active_seconds += seconds_since(t_step);
    EngineGauges& g = stats_.engine;
    g.peak_batch = std::max<int64_t>(g.peak_batch, static_cast<int64_t>(plan.chunks.size()));
    g.num_preemptions = scheduler_->num_preemptions();
    g.num_running = scheduler_->num_running();
    g.num_waiting = scheduler_->num_waiting();
    g.kv_blocks_total = cache_->num_blocks();
    g.kv_blocks_free = cache_->num_free_blocks();
  }

  // sd: the draft model drafts every speculative chunk's tokens on this thread.
  bool draft_sync(const std::vector<runtime::ScheduledChunk>& chunks, std::vector<Proposal>& proposals,
                  runtime::DraftBatch& drafts, std::vector<Response>& responses) {
    std::vector<runtime::Sequence*> spec_seqs;
    std::vector<int64_t> spec_counts;
    for (const auto& c : chunks)
      if (c.speculative) {
        spec_seqs.push_back(c.seq);
        spec_counts.push_back(c.draft_tokens);
      }
    if (spec_seqs.empty()) return true;
    try {
      drafts = drafter_->draft(spec_seqs, spec_counts);
    } catch (const std::exception& e) {
      for (Sequence* seq : spec_seqs)
        finish(seq, FinishReason::kError, std::string("draft failed: ") + e.what(), responses);
      return false;
    }
    const int64_t vocab = model_->config().vocab_size;
    for (size_t i = 0, b = 0; i < chunks.size(); ++i) {
      if (!chunks[i].speculative) continue;
      Proposal& p = proposals[i];
      p.tokens.assign(drafts.tokens.begin() + b * drafts.k, drafts.tokens.begin() + b * drafts.k + drafts.counts[b]);
      p.q = drafts.q.data() + b * drafts.k * vocab;
      ++b;
    }
    return true;
  }

  // ssd: every speculative chunk verifies the speculation the draft worker
  // sent for its sequence; waits for the missing ones. Chunks whose drafting
  // failed are finished and dropped. Returns the seconds spent waiting.
  double await_speculations(std::vector<runtime::ScheduledChunk>& chunks, std::vector<Proposal>& proposals,
                            std::vector<Response>& responses) {
    for (const auto& c : chunks)
      if (c.speculative && !c.seq->spec_started) start_draft(c.seq);
    flush_to_draft();
    const auto t0 = Clock::now();
    for (;;) {
      bool missing = false;
      for (const auto& c : chunks) missing = missing || (c.speculative && !ready_specs_.count(c.seq->id));
      if (!missing) break;
      std::vector<runtime::Speculation> got;
      worker_->collect(got, 1.0);
      for (auto& spec : got) {
        auto it = live_.find(spec.id);
        if (it == live_.end() || !it->second->spec_started || it->second->spec_epoch != spec.epoch) continue;
        ready_specs_[spec.id] = std::move(spec);
      }
    }
    const double wait_s = seconds_since(t0);
    std::vector<runtime::ScheduledChunk> kept;
    std::vector<Proposal> kept_proposals;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      Proposal p;
      if (c.speculative) {
        const runtime::Speculation& spec = ready_specs_.at(c.seq->id);
        if (!spec.error.empty()) {
          finish(c.seq, FinishReason::kError, spec.error, responses);
          continue;
        }
        const auto count = std::min<int64_t>(c.draft_tokens, static_cast<int64_t>(spec.tokens.size()));
        p.tokens.assign(spec.tokens.begin(), spec.tokens.begin() + count);
        p.q = spec.q.empty() ? nullptr : spec.q.data();
        p.one_hot = spec.one_hot;
        p.source = static_cast<int>(spec.source);
      }
      kept.push_back(c);
      kept_proposals.push_back(std::move(p));
    }
    chunks.swap(kept);
    proposals.swap(kept_proposals);
    return wait_s;
  }

  void start_draft(Sequence* seq) {
    runtime::SpecMessage m;
    m.kind = runtime::SpecMessage::Kind::kStart;
    m.id = seq->id;
    m.epoch = ++seq->spec_epoch;
    m.tokens = seq->tokens;
    m.params = seq->params;
    m.seed = seq->seed;
    seq->spec_started = true;
    to_draft_.push_back(std::move(m));
  }

  // ssd: the draft worker forgets this life of the sequence.
  void release_draft(Sequence* seq) {
    if (!worker_ || !seq->spec_started) return;
    runtime::SpecMessage m;
    m.kind = runtime::SpecMessage::Kind::kRelease;
    m.id = seq->id;
    m.epoch = seq->spec_epoch;
    seq->spec_started = false;
    ready_specs_.erase(seq->id);
    to_draft_.push_back(std::move(m));
  }

  void flush_to_draft() {
    if (worker_ && !to_draft_.empty()) worker_->post(std::move(to_draft_));
    to_draft_.clear();
  }

  // Samples, verifies and appends; returns the number of tokens emitted.
  int64_t postprocess(const std::vector<runtime::ScheduledChunk>& chunks, const std::vector<Proposal>& proposals,
                      const at::Tensor& logits, double forward_s, std::vector<Response>& responses) {
    const int64_t vocab = model_->config().vocab_size;
    const float* row_ptr = logits.data_ptr<float>();
    int64_t emitted = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      if (c.speculative) {
        const auto rows = 1 + static_cast<int64_t>(proposals[i].tokens.size());
        const RoundResult round = verify_round(c.seq, row_ptr, proposals[i], responses);
        emitted += round.emitted;
        row_ptr += rows * vocab;
        if (worker_ && !round.finished) {
          runtime::SpecMessage m;
          m.kind = runtime::SpecMessage::Kind::kOutcome;
          m.id = c.seq->id;
          m.epoch = c.seq->spec_epoch;
          m.accepted = round.accepted;
          m.proposed = static_cast<int64_t>(proposals[i].tokens.size());
          m.bonus = round.bonus;
          m.verify_seconds = forward_s;
          ready_specs_.erase(c.seq->id);
          to_draft_.push_back(std::move(m));
        }
        continue;
      }
      c.seq->num_computed += c.num_tokens;
      // ssd: the draft worker starts on a sequence as soon as its prefill is done.
      if (worker_ && !c.seq->spec_started && c.seq->num_computed >= c.seq->len() - 1) start_draft(c.seq);
      if (!c.wants_logits) continue;
      try {
        append_token(c.seq, sample(*c.seq, row_ptr), responses);
        ++emitted;
      } catch (const std::exception& e) {
        finish(c.seq, FinishReason::kError, std::string("sampling failed: ") + e.what(), responses);
      }
      row_ptr += vocab;
    }
    return emitted;
  }

  // One speculative round of `seq`: verifies its proposals against the target
  // rows (1 + count rows at `target`), appends the accepted tokens and the
  // bonus, and rolls the KV caches back to what the new sequence keeps.
  RoundResult verify_round(Sequence* seq, const float* target, const Proposal& prop,
                           std::vector<Response>& responses) {
    RoundResult result;
    const int64_t vocab = model_->config().vocab_size;
    const auto count = static_cast<int64_t>(prop.tokens.size());
    const int64_t k = std::max<int64_t>(count, 1);
    const int64_t start = seq->len();  // position of the first draft token
    const RequestId id = seq->id;      // seq is gone once it finishes
    for (int64_t i = 0; i < (1 + count) * vocab; ++i)
      if (std::isnan(target[i])) {
        finish(seq, FinishReason::kError, "sampling failed: logits contain NaN", responses);
        result.finished = true;
        return result;
      }
    std::vector<float> target_rows(static_cast<size_t>((k + 1) * vocab), 0.0f);
    std::copy(target, target + (1 + count) * vocab, target_rows.begin());
    std::vector<int64_t> proposals(static_cast<size_t>(k), 0);
    std::copy(prop.tokens.begin(), prop.tokens.end(), proposals.begin());
    std::vector<float> q(static_cast<size_t>(k * vocab), 0.0f);
    if (!prop.one_hot && count > 0) std::copy(prop.q, prop.q + count * vocab, q.begin());
    std::vector<double> accept_u(static_cast<size_t>(k), 0.0);
    for (int64_t i = 0; i < count; ++i)
      accept_u[i] = kernels::keyed_uniform(seq->seed, static_cast<uint64_t>(start + i),
                                           kernels::RandomPurpose::kAccept);
    const double bonus_u = kernels::keyed_uniform(seq->seed, static_cast<uint64_t>(start),
                                                  kernels::RandomPurpose::kResidual);
    const bool one_hot = prop.one_hot;
    const double temperature = one_hot && testing_.fault_fast_argmax ? 0.0 : seq->params.temperature;
    const double top_p = seq->params.top_p;
    const int64_t top_k = seq->params.top_k;
    int64_t accepted = 0, bonus = 0;
    kernels::VerifyParams v;
    v.target_logits = target_rows.data();
    v.proposals = proposals.data();
    v.num_proposals = &count;
    v.q_probs = q.data();
    v.one_hot = &one_hot;
    v.temperature = &temperature;
    v.top_k = &top_k;
    v.top_p = &top_p;
    v.accept_uniforms = accept_u.data();
    v.bonus_uniforms = &bonus_u;
    v.accepted = &accepted;
    v.bonus = &bonus;
    v.batch = 1;
    v.k = k;
    v.vocab = vocab;
    kernels::verify(v, 0, 1);
    // The KV of the verified token and the accepted drafts stays.
    seq->num_computed = start + accepted;
    cache_->truncate(seq->table, seq->num_computed);
    if (drafter_) drafter_->commit(seq, start + accepted);
    for (int64_t i = 0; i <= accepted; ++i) {
      const auto token = static_cast<int32_t>(i < accepted ? proposals[i] : bonus);
      ++result.emitted;
      if (append_token(seq, token, responses)) {
        result.finished = true;
        break;
      }
    }
    result.accepted = accepted;
    result.bonus = static_cast<int32_t>(bonus);
    // Metrics; a finished request already reported its own, so count it there too.
    SpecCounters delta;
    delta.rounds = 1;
    delta.draft_tokens_proposed = count;
    delta.draft_tokens_accepted = accepted;
    using runtime::SpecSource;
    if (prop.source >= 0 && static_cast<SpecSource>(prop.source) != SpecSource::kStart) {
      delta.cache_lookups = 1;
      if (static_cast<SpecSource>(prop.source) == SpecSource::kHit) {
        delta.cache_hits = 1;
        delta.hit_tokens = result.emitted;
      } else {
        if (static_cast<SpecSource>(prop.source) == SpecSource::kFast) {
          delta.fallback_fast = 1;
          delta.fast_tokens_proposed = count;
          delta.fast_tokens_accepted = accepted;
        } else {
          delta.fallback_neural = 1;
        }
        delta.miss_tokens = result.emitted;
      }
    }
    add_round_metrics(result.finished ? nullptr : seq, id, delta, responses);
    return result;
  }

  // seq: null when the round finished it (its final response is amended instead).
  void add_round_metrics(Sequence* seq, RequestId id, const SpecCounters& d, std::vector<Response>& responses) {
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

  int32_t sample(const Sequence& seq, const float* logits) {
    const int64_t vocab = model_->config().vocab_size;
    for (int64_t i = 0; i < vocab; ++i)
      if (std::isnan(logits[i])) throw std::runtime_error("logits contain NaN");
    const auto& p = seq.params;
    if (p.temperature == 0.0) return kernels::argmax(logits, vocab);
    probs_.resize(static_cast<size_t>(vocab));
    kernels::process_logits(logits, vocab, {p.temperature, p.top_k, p.top_p}, probs_.data(), logits_scratch_);
    const double u = kernels::keyed_uniform(seq.seed, static_cast<uint64_t>(seq.len()),
                                            kernels::RandomPurpose::kSample);
    return kernels::sample_from_probs(probs_.data(), vocab, u);
  }

  // Appends a token and applies the stop rules; true when the request finished.
  bool append_token(Sequence* seq, int32_t token, std::vector<Response>& responses) {
    seq->tokens.push_back(token);
    if (seq->generated() == 1) seq->metrics.time_to_first_token = seconds_since(seq->enqueued);
    const auto& p = seq->params;
    FinishReason reason = FinishReason::kNone;
    const bool is_eos = std::find(eos_.begin(), eos_.end(), token) != eos_.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
                         p.stop_token_ids.end();
    if ((is_eos && !p.ignore_eos) || is_stop) reason = FinishReason::kStop;
    else if (seq->generated() >= p.max_tokens || seq->len() >= config_.max_model_len)
      reason = FinishReason::kLength;
    if (reason != FinishReason::kNone) {
      finish(seq, reason, "", responses, {token});
      return true;
    }
    Response r;
    r.id = seq->id;
    r.tokens = {token};
    responses.push_back(std::move(r));
    return false;
  }

  void finish_cancelled(RequestId id, std::vector<Response>& responses) {
    auto it = live_.find(id);
    if (it != live_.end()) finish(it->second.get(), FinishReason::kCancelled, "", responses);
  }

  void finish(Sequence* seq, FinishReason reason, const std::string& error,
              std::vector<Response>& responses, std::vector<int32_t> tokens = {}) {
    release_draft(seq);
    scheduler_->remove(seq);
    Response r;
    r.id = seq->id;
    r.tokens = std::move(tokens);
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
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<runtime::Drafter> drafter_;
  std::unique_ptr<runtime::SsdDraftWorker> worker_;             // ssd
  std::map<RequestId, runtime::Speculation> ready_specs_;    // ssd, engine thread only
  std::vector<runtime::SpecMessage> to_draft_;               // ssd, posted once per step
  std::unique_ptr<runtime::Scheduler> scheduler_;
  std::unique_ptr<kernels::ThreadPool> pool_ = std::make_unique<kernels::ThreadPool>(config_.target_threads);
  std::random_device seed_source_;
  std::map<RequestId, std::unique_ptr<Sequence>> live_;  // engine thread only
  std::vector<float> probs_;
  kernels::LogitsScratch logits_scratch_;

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

Engine::Engine(const EngineConfig& config, std::shared_ptr<model::Model> target,
               std::vector<int32_t> eos_token_ids, std::shared_ptr<model::Model> draft,
               const TestingConfig& testing)
    : impl_(std::make_unique<Impl>(config, std::move(target), std::move(eos_token_ids), std::move(draft),
                                   testing)) {}
Engine::~Engine() = default;
RequestId Engine::enqueue(Request request) { return impl_->enqueue(std::move(request)); }
std::vector<RequestId> Engine::enqueue_batch(std::vector<Request> requests) {
  return impl_->enqueue_batch(std::move(requests));
}
std::vector<Response> Engine::await_responses(double timeout_s) { return impl_->await_responses(timeout_s); }
void Engine::cancel(RequestId id) { impl_->cancel(id); }
void Engine::shutdown() { impl_->shutdown(); }
EngineStats Engine::stats() const { return impl_->stats(); }
const EngineConfig& Engine::config() const { return impl_->config(); }

}  // namespace ssd
