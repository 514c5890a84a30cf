// The decoder forward of every supported architecture (Llama-3, Qwen2,
// Qwen3, Mistral) over a paged KV cache. One entry point
// serves prefill (many tokens per sequence), decode (one token) and scoring of
// several new tokens on top of a cached prefix: every token is written to its
// cache slot and attends causally to its own sequence. The forward is written
// once, over the device steps of a Backend (backend.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "backend.h"
#include "kv_cache.h"
#include "tensor_parallel.h"
#include "ssd/config.h"

namespace ssd::model {

using WeightMap = std::unordered_map<std::string, at::Tensor>;
/// Weights held in a GGUF block format (kernels/cpu/quant.h): name -> format.
/// Such a weight [n, k] is passed as its GGUF rows, uint8 [n, gguf_row_bytes].
using FormatMap = std::unordered_map<std::string, kernels::QuantType>;

/// Where a model runs.
struct ModelPlacement {
  std::string device = "cpu";   ///< "cpu", "cuda" or "cuda:N"
  std::string backend = "auto"; ///< "auto" (the device's native backend) or "aten" (the reference)
  BackendOptions options;
  /// This process's rank of a tensor-parallel group (tensor_parallel.h);
  /// size 1: the whole model.
  TensorParallel tensor_parallel;
};

class Model {
 public:
  /// Weights use HuggingFace names; float32 or bfloat16 tensors on any device
  /// (the backend copies them to its own), or for the matrices (embedding
  /// included) GGUF blocks named in `formats`. Throws std::invalid_argument
  /// naming a missing or mis-shaped tensor, or a device this build or machine
  /// lacks.
  ///
  /// A quantized matrix stays in its blocks on a backend that multiplies them
  /// (cpu), and its product equals the dequantised matrix's bit for bit; the
  /// others dequantise it to fp32. Parts fused into one matrix (q/k/v,
  /// gate/up) that differ in format are dequantised to the model's dtype.
  Model(const ModelConfig& config, const WeightMap& weights, const ModelPlacement& placement = {},
        const FormatMap& formats = {});

  const ModelConfig& config() const { return config_; }
  /// The config this rank computes (its heads and intermediate rows; config()
  /// without tensor parallelism): what its KV cache holds.
  const ModelConfig& shard_config() const { return shard_config_; }
  /// The tensor-parallel sums so far: collective calls and their seconds.
  int64_t collective_calls() const { return row_sum_.calls(); }
  double collective_seconds() const { return row_sum_.seconds(); }
  bool bf16() const { return bf16_; }
  const Backend& backend() const { return *backend_; }
  /// Bytes the backend holds for the weights (one count per shared tensor).
  int64_t weight_bytes() const;
  /// "cpu" or "cuda:N" (the backend's device).
  std::string device() const { return backend_->device().str(); }

  /// Runs the batch, writing K/V into `cache` (made with this model's
  /// backend); returns logits [rows, vocab] fp32 on the host for
  /// input.logit_rows. `pool` runs the cpu backend's kernels.
  at::Tensor forward(const ForwardInput& input, KvCache& cache, kernels::ThreadPool& pool) const;
  /// The same forward, its logits [rows, vocab] fp32 left on the backend's
  /// device (queued on the model's stream): the engine's round reads them there.
  /// On a backend that captures forwards (the cuda one, with cuda_graphs)
  /// and without tensor parallelism, this is forward_bucketed.
  at::Tensor forward_device(const ForwardInput& input, KvCache& cache, kernels::ThreadPool& pool) const;
  /// forward_device over the input padded to its bucket shape
  /// (forward_shape.h) and run through Backend::graphed: on the cuda backend
  /// the replay of a graph captured per shape, elsewhere the padded forward
  /// as it is. The same logits, bitwise, and the same K / V written.
  /// Forwards past the largest bucket run unpadded. Not with tensor
  /// parallelism (std::logic_error).
  at::Tensor forward_bucketed(const ForwardInput& input, KvCache& cache, kernels::ThreadPool& pool) const;

  /// Tensor parallelism, one process per rank. Either every rank calls
  /// forward with the same input (SPMD), or rank 0 leads: with lead(true) its
  /// every forward first sends its input and cache geometry to the other
  /// ranks, which sit in follow(): each runs the same forward on its shard
  /// and on a KV cache of its own per leader cache, until rank 0 calls
  /// stop_followers(). std::logic_error for lead on another rank than 0, or
  /// follow on rank 0 or without a group.
  int64_t tensor_parallel_size() const { return tp_.size; }
  int64_t tensor_parallel_rank() const { return tp_.rank; }
  void lead(bool on);
  void follow(int64_t num_threads);
  void stop_followers();
  /// Rank 0 leading: when nothing has been sent to the followers for
  /// `quiet_s` seconds, sends them a ping (each waits for rank 0 only as long
  /// as the group's timeout); true when it did. A rank that is gone makes it
  /// throw, as a forward would.
  bool ping_followers(double quiet_s);

 private:
  struct Layer {
    at::Tensor attn_norm, qkv_bias, q_norm, k_norm, o_bias;
    at::Tensor mlp_norm, gate_up_bias, down_bias;
    Matrix qkv, o, gate_up, down;
  };

  /// A weight of `rows` rows of which this rank holds `take`.
  struct Part {
    std::string name;
    int64_t rows;
    Share take;
  };
  /// One weight matrix [sum of the parts' taken rows, cols.count] from the
  /// named [rows, k] parts, fused in order.
  Matrix load_matrix(const WeightMap& w, const FormatMap& formats, const std::vector<Part>& parts, int64_t k,
                     Share cols, at::ScalarType dtype) const;
  Matrix load_matrix(const WeightMap& w, const FormatMap& formats, const std::string& name, int64_t rows, int64_t k,
                     at::ScalarType dtype) const {
    return load_matrix(w, formats, {{name, rows, {0, rows}}}, k, {0, k}, dtype);
  }
  void check(const ForwardInput& input, const KvCache& cache) const;
  void attention_block(const Layer& layer, int64_t index, const DeviceBatch& batch, KvCache& cache,
                       const at::Tensor& x, StepContext& ctx) const;
  void mlp_block(const Layer& layer, const at::Tensor& x, StepContext& ctx) const;
  /// A checked forward as it is, uploaded and run (no graph).
  at::Tensor unpadded(const ForwardInput& input, KvCache& cache, kernels::ThreadPool& pool) const;
  /// The layers over an uploaded batch -> logits [logit rows, vocab] on the device.
  at::Tensor layers(const DeviceBatch& batch, KvCache& cache, StepContext& ctx) const;

  ModelConfig config_;
  ShardLayout shard_;
  ModelConfig shard_config_;  ///< config_ with this rank's heads and intermediate rows
  RowParallelSum row_sum_;
  bool row_bias_ = true;  ///< rank 0 adds the row-parallel products' biases
  TensorParallel tp_;
  bool leading_ = false;
  /// When rank 0 last sent its followers a message (ping_followers).
  mutable std::chrono::steady_clock::time_point last_message_ = std::chrono::steady_clock::now();
  std::unique_ptr<Backend> backend_;
  bool int8_activations_ = true;  ///< BackendOptions::int8_activations
  bool bf16_ = false;
  at::Tensor embed_, final_norm_, inv_freq_;
  Matrix embed_rows_;  ///< the embedding when the backend keeps it quantized (embed_ undefined)
  Matrix lm_head_;
  std::vector<Layer> layers_;
};

/// Rotary inverse frequencies [head_dim / 2], with llama3 scaling (rope_scaling)
/// or the per-dimension divisors (rope_freq_factors) applied.
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace ssd::model
