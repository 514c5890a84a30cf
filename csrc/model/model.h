// Llama-3 / Qwen3 decoder forward over a paged KV cache. One entry point
// serves prefill (many tokens per sequence), decode (one token) and scoring of
// several new tokens on top of a cached prefix: every token is written to its
// cache slot and attends causally to its own sequence.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "../kernels/cpu/thread_pool.h"
#include "kv_cache.h"
#include "ssd/config.h"

namespace ssd::model {

/// Tokens of several sequences flattened into one batch.
struct ForwardInput {
  std::vector<int32_t> tokens;        ///< [T]
  std::vector<int32_t> positions;     ///< [T] position of each token in its sequence
  std::vector<int32_t> seq_of_token;  ///< [T] index into block_tables
  std::vector<int32_t> block_tables;  ///< [num_seqs, max_blocks], row-major
  int64_t max_blocks = 0;
  std::vector<int32_t> logit_rows;    ///< rows of the batch whose logits are wanted
  /// > 0: matrix products over at least this many rows use the bf16 pair
  /// kernels (kernels::linear_pairs: AVX512-BF16, 16 rows cost little more
  /// than one). Results carry bf16 rounding and differ from the exact path,
  /// so only the draft uses it, for its tree; exactness never depends on the
  /// draft's numerics.
  int64_t matmul_min_rows = 0;
};

using WeightMap = std::unordered_map<std::string, at::Tensor>;

class Model {
 public:
  /// Weights use HuggingFace names; float32 or bfloat16 matrices on the CPU.
  /// Throws std::invalid_argument naming a missing or mis-shaped tensor.
  Model(const ModelConfig& config, const WeightMap& weights);

  const ModelConfig& config() const { return config_; }
  bool bf16() const { return bf16_; }

  /// Runs the batch, writing K/V into `cache`; returns logits [rows, vocab] fp32
  /// for input.logit_rows.
  at::Tensor forward(const ForwardInput& input, KvCache& cache, kernels::ThreadPool& pool) const;

 private:
  /// A weight matrix [n, k] in the exact packed layout (kernels::pack).
  struct Matrix {
    at::Tensor packed;
    int64_t n = 0, k = 0;
  };
  struct Layer {
    at::Tensor attn_norm, qkv_bias, q_norm, k_norm, o_bias;
    at::Tensor mlp_norm, gate_up_bias, down_bias;
    Matrix qkv, o, gate_up, down;
  };

  Matrix pack(const at::Tensor& dense) const;
  void linear(const float* x, int64_t ldx, const Matrix& w, const at::Tensor& bias, float* y,
              int64_t ldy, int64_t m, kernels::ThreadPool& pool, int64_t matmul_min_rows = 0) const;
  /// The pair layout of a matrix for the many-row draft path (made on first use).
  const uint16_t* pair_weight(const Matrix& w) const;
  void embed(const std::vector<int32_t>& tokens, float* out) const;
  void attention_block(const Layer& layer, int64_t index, const ForwardInput& input,
                       KvCache& cache, float* x, kernels::ThreadPool& pool) const;
  void mlp_block(const Layer& layer, int64_t tokens, float* x, kernels::ThreadPool& pool,
                 int64_t matmul_min_rows) const;

  ModelConfig config_;
  bool bf16_ = false;
  at::Tensor embed_, final_norm_;
  Matrix lm_head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  mutable std::mutex pair_mu_;
  mutable std::unordered_map<const void*, std::vector<uint16_t>> pair_weights_;
};

/// Rotary inverse frequencies [head_dim / 2], with llama3 scaling applied.
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace ssd::model
