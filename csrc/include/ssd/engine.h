// The embeddable engine: enqueue requests, await streamed responses.
//
//   ssd::Engine engine(config, std::move(target_model));
//   auto id = engine.enqueue({prompt_ids, params});
//   while (...) for (auto& r : engine.await_responses(0.1)) { ... }
//   engine.shutdown();
#pragma once

#include <memory>
#include <vector>

#include "ssd/config.h"
#include "ssd/types.h"

namespace ssd {

namespace model {
class Model;
}

class Engine {
 public:
  /// Starts the engine thread. `eos_token_ids` end a request unless ignore_eos.
  /// `draft` is required by mode "sd" and refused by "ar". Throws
  /// std::invalid_argument for an invalid config or a draft whose vocabulary
  /// differs from the target's. `testing` holds test-only switches (tests
  /// and fault injection; a product never sets them).
  Engine(const EngineConfig& config, std::shared_ptr<model::Model> target,
         std::vector<int32_t> eos_token_ids, std::shared_ptr<model::Model> draft = nullptr,
         const TestingConfig& testing = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Validates and queues a request. Throws std::invalid_argument (naming the
  /// problem) without queueing anything when the request is invalid.
  RequestId enqueue(Request request);
  /// Validates every request, then queues them all at once, so the engine's
  /// next step sees the whole batch (one prefill instead of a staggered start).
  /// Throws std::invalid_argument naming the request's index, queueing nothing.
  std::vector<RequestId> enqueue_batch(std::vector<Request> requests);
  /// Waits up to timeout_s seconds for responses; returns all that are ready.
  std::vector<Response> await_responses(double timeout_s);
  /// Ends a request with kCancelled; unknown or finished ids are ignored.
  void cancel(RequestId id);
  /// Stops the engine thread; pending requests finish with kCancelled.
  void shutdown();
  EngineStats stats() const;
  /// Why the engine has failed, or "" while it works. Only a tensor-parallel
  /// target fails the engine (a rank lost or hung past
  /// tensor_parallel_timeout_s, or any forward error: the ranks may be out of
  /// step): every request ends with finish reason "error" and this message,
  /// and enqueue throws std::runtime_error from then on.
  std::string failure() const;
  const EngineConfig& config() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ssd
