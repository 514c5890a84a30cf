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

namespace ssd {

using runtime::Clock;
using runtime::Sequence;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

class Engine::Impl {
 public:
  Impl(const EngineConfig& config, std::shared_ptr<model::Model> target, std::vector<int32_t> eos,
       std::shared_ptr<model::Model> draft)
      : config_(config), model_(std::move(target)), eos_(std::move(eos)) {
    config_.validate();
    if (!model_) throw std::invalid_argument("target model is null");
    check_draft(draft.get());
    cache_ = std::make_unique<model::KvCache>(model_->config(), config_.num_kv_blocks(),
                                              config_.kv_block_size);
    int64_t lookahead = 0;
    if (draft) {
      drafter_ = std::make_unique<runtime::Drafter>(std::move(draft), config_.num_kv_blocks(),
                                                    config_.kv_block_size, config_.draft_threads);
      lookahead = config_.k;
    }
    scheduler_ = std::make_unique<runtime::Scheduler>(config_, *cache_, lookahead,
                                                      drafter_ ? &drafter_->cache() : nullptr);
    thread_ = std::thread([this] { loop(); });
  }

  ~Impl() { shutdown(); }

  RequestId enqueue(Request request) {
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
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw std::runtime_error("engine is shut down");
    seq->seed = request.params.has_seed ? request.params.seed
                                           : (uint64_t{seed_source_()} << 32) | seed_source_();
    seq->metrics.seed = seq->seed;
    seq->id = next_id_++;
    const RequestId id = seq->id;
    inbox_.push_back(std::move(seq));
    wake_.notify_all();
    return id;
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
  }

  EngineStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void check_draft(const model::Model* draft) const {
    if (config_.mode == "ar") {
      if (draft) throw std::invalid_argument("mode: 'ar' takes no draft model (use 'sd')");
      return;
    }
    if (config_.mode == "ssd")
      throw std::invalid_argument("mode: 'ssd' is not available yet; use 'sd' or 'ar'");
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
    runtime::ScheduleResult plan = scheduler_->schedule();
    for (Sequence* seq : plan.failed) finish(seq, FinishReason::kError, plan.failure, responses);
    if (plan.chunks.empty()) return;
    std::vector<runtime::Sequence*> spec_seqs;
    std::vector<int64_t> spec_counts;
    for (const auto& c : plan.chunks)
      if (c.speculative) {
        spec_seqs.push_back(c.seq);
        spec_counts.push_back(c.draft_tokens);
      }
    runtime::DraftBatch drafts;
    std::vector<std::vector<int32_t>> extra(plan.chunks.size());
    try {
      if (!spec_seqs.empty()) drafts = drafter_->draft(spec_seqs, spec_counts);
    } catch (const std::exception& e) {
      for (Sequence* seq : spec_seqs) finish(seq, FinishReason::kError, std::string("draft failed: ") + e.what(), responses);
      return;
    }
    for (size_t i = 0, b = 0; i < plan.chunks.size(); ++i) {
      if (!plan.chunks[i].speculative) continue;
      for (int64_t j = 0; j < drafts.counts[b]; ++j)
        extra[i].push_back(static_cast<int32_t>(drafts.tokens[b * drafts.k + j]));
      ++b;
    }
    const model::ForwardInput input = scheduler_->build_input(plan.chunks, extra);
    const auto t0 = Clock::now();
    at::Tensor logits;
    try {
      logits = model_->forward(input, *cache_, *pool_);
    } catch (const std::exception& e) {
      for (const auto& c : plan.chunks)
        finish(c.seq, FinishReason::kError, std::string("forward failed: ") + e.what(), responses);
      return;
    }
    const double forward_s = seconds_since(t0);
    const int64_t emitted = postprocess(plan.chunks, logits, drafts, responses);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.steps += 1;
    stats_.forward_tokens += static_cast<int64_t>(input.tokens.size());
    stats_.generated_tokens += emitted;
    stats_.forward_seconds += forward_s;
    stats_.peak_batch = std::max<int64_t>(stats_.peak_batch, static_cast<int64_t>(plan.chunks.size()));
    stats_.num_preemptions = scheduler_->num_preemptions();
    stats_.num_running = scheduler_->num_running();
    stats_.num_waiting = scheduler_->num_waiting();
    stats_.kv_blocks_total = cache_->num_blocks();
    stats_.kv_blocks_free = cache_->num_free_blocks();
  }

  // Samples, verifies and appends; returns the number of tokens emitted.
  int64_t postprocess(const std::vector<runtime::ScheduledChunk>& chunks, const at::Tensor& logits,
                      const runtime::DraftBatch& drafts, std::vector<Response>& responses) {
    const int64_t vocab = model_->config().vocab_size;
    const float* row_ptr = logits.data_ptr<float>();
    int64_t emitted = 0, b = 0;
    for (const auto& c : chunks) {
      if (c.speculative) {
        const int64_t rows = 1 + drafts.counts[b];
        emitted += verify_round(c.seq, row_ptr, drafts, b++, responses);
        row_ptr += rows * vocab;
        continue;
      }
      c.seq->num_computed += c.num_tokens;
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

  // One speculative round of `seq`: verifies its drafts against the target rows
  // (1 + count rows at `target`), appends the accepted tokens and the bonus,
  // and rolls both KV caches back to what the new sequence keeps.
  int64_t verify_round(Sequence* seq, const float* target, const runtime::DraftBatch& drafts,
                       int64_t b, std::vector<Response>& responses) {
    const int64_t vocab = model_->config().vocab_size;
    const int64_t count = drafts.counts[b];
    const int64_t k = std::max<int64_t>(count, 1);
    const int64_t start = seq->len();  // position of the first draft token
    for (int64_t i = 0; i < (1 + count) * vocab; ++i)
      if (std::isnan(target[i])) {
        finish(seq, FinishReason::kError, "sampling failed: logits contain NaN", responses);
        return 0;
      }
    std::vector<float> target_rows(static_cast<size_t>((k + 1) * vocab), 0.0f);
    std::copy(target, target + (1 + count) * vocab, target_rows.begin());
    std::vector<int64_t> proposals(static_cast<size_t>(k), 0);
    std::vector<float> q(static_cast<size_t>(k * vocab), 0.0f);
    std::copy(drafts.tokens.begin() + b * drafts.k, drafts.tokens.begin() + b * drafts.k + count, proposals.begin());
    std::copy(drafts.q.begin() + b * drafts.k * vocab, drafts.q.begin() + (b * drafts.k + count) * vocab, q.begin());
    std::vector<double> accept_u(static_cast<size_t>(k), 0.0);
    for (int64_t i = 0; i < count; ++i)
      accept_u[i] = kernels::keyed_uniform(seq->seed, static_cast<uint64_t>(start + i),
                                           kernels::RandomPurpose::kAccept);
    const double bonus_u = kernels::keyed_uniform(seq->seed, static_cast<uint64_t>(start),
                                                  kernels::RandomPurpose::kResidual);
    const bool one_hot = false;
    const double temperature = seq->params.temperature, top_p = seq->params.top_p;
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
    seq->metrics.draft_tokens_proposed += count;
    seq->metrics.draft_tokens_accepted += accepted;
    seq->metrics.rounds += 1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.draft_tokens_proposed += count;
      stats_.draft_tokens_accepted += accepted;
      stats_.rounds += 1;
    }
    // The KV of the verified token and the accepted drafts stays.
    seq->num_computed = start + accepted;
    cache_->truncate(seq->table, seq->num_computed);
    drafter_->commit(seq, start + accepted);
    int64_t emitted = 0;
    for (int64_t i = 0; i <= accepted; ++i) {
      const auto token = static_cast<int32_t>(i < accepted ? proposals[i] : bonus);
      ++emitted;
      if (append_token(seq, token, responses)) break;
    }
    return emitted;
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
    stats_.num_finished += 1;
  }

  void publish(std::vector<Response> responses) {
    if (responses.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& r : responses) outbox_.push_back(std::move(r));
    ready_.notify_all();
  }

  EngineConfig config_;
  std::shared_ptr<model::Model> model_;
  std::vector<int32_t> eos_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<runtime::Drafter> drafter_;
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
               std::vector<int32_t> eos_token_ids, std::shared_ptr<model::Model> draft)
    : impl_(std::make_unique<Impl>(config, std::move(target), std::move(eos_token_ids),
                                   std::move(draft))) {}
Engine::~Engine() = default;
RequestId Engine::enqueue(Request request) { return impl_->enqueue(std::move(request)); }
std::vector<Response> Engine::await_responses(double timeout_s) { return impl_->await_responses(timeout_s); }
void Engine::cancel(RequestId id) { impl_->cancel(id); }
void Engine::shutdown() { impl_->shutdown(); }
EngineStats Engine::stats() const { return impl_->stats(); }
const EngineConfig& Engine::config() const { return impl_->config(); }

}  // namespace ssd
