#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <sstream>
#include <string>

#include <unistd.h>

#include "ssd/config.h"
#include "../model/backend.h"
#include "ssd/log.h"
#include "ssd/types.h"

namespace ssd {

namespace {

[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw std::invalid_argument(field + ": " + why);
}

void positive(const std::string& field, int64_t v) {
  if (v <= 0) bad(field, "must be > 0, got " + std::to_string(v));
}

void threads(const std::string& field, int64_t v) {
  if (v <= 0 || v > kMaxThreads)
    bad(field, "must be in [1, " + std::to_string(kMaxThreads) + "], got " + std::to_string(v));
}

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  std::ostringstream out;
  out.precision(3);
  out << bytes / kGiB << " GiB";
  return out.str();
}

// Physical memory of this machine in bytes (0 when unknown).
double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

// Weight shapes multiply these sizes; a config read from a corrupt file may
// hold values whose products overflow int64.
void product_fits(const std::string& field, int64_t a, int64_t b) {
  if (a > std::numeric_limits<int64_t>::max() / b)
    bad(field, "is too large (" + std::to_string(a) + " x " + std::to_string(b) + " overflows int64)");
}

}  // namespace

Architecture parse_architecture(const std::string& name) {
  if (name == "LlamaForCausalLM") return Architecture::kLlama;
  if (name == "Qwen2ForCausalLM") return Architecture::kQwen2;
  if (name == "Qwen3ForCausalLM") return Architecture::kQwen3;
  if (name == "MistralForCausalLM") return Architecture::kMistral;
  throw std::invalid_argument("unsupported architecture '" + name +
                              "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                              "MistralForCausalLM)");
}

void ModelConfig::validate() const {
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_layers", num_layers);
  positive("num_heads", num_heads);
  positive("num_kv_heads", num_kv_heads);
  positive("head_dim", head_dim);
  if (num_heads % num_kv_heads != 0)
    bad("num_kv_heads", "must divide num_heads (" + std::to_string(num_heads) + "), got " +
                            std::to_string(num_kv_heads));
  if (head_dim % 2 != 0) bad("head_dim", "must be even for rotary embeddings");
  product_fits("num_heads", num_heads, head_dim);
  product_fits("vocab_size", vocab_size, hidden_size);
  product_fits("intermediate_size", intermediate_size, hidden_size);
  product_fits("hidden_size", hidden_size, num_heads * head_dim);
  if (!(rms_norm_eps > 0)) bad("rms_norm_eps", "must be > 0");
  if (!(rope_theta > 0)) bad("rope_theta", "must be > 0");
  if (rope_scaling.enabled && !(rope_scaling.factor > 0 &&
                                rope_scaling.high_freq_factor > rope_scaling.low_freq_factor))
    bad("rope_scaling", "llama3 scaling needs factor > 0 and high_freq_factor > low_freq_factor");
  if (!rope_freq_factors.empty()) {
    if (static_cast<int64_t>(rope_freq_factors.size()) != head_dim / 2)
      bad("rope_freq_factors", "must hold head_dim / 2 = " + std::to_string(head_dim / 2) + " values, got " +
                                   std::to_string(rope_freq_factors.size()));
    for (double f : rope_freq_factors)
      if (!(std::isfinite(f) && f > 0)) bad("rope_freq_factors", "every factor must be finite and > 0");
    if (rope_scaling.enabled) bad("rope_freq_factors", "give either rope_scaling or rope_freq_factors, not both");
  }
  if (attention_bias && qkv_bias)
    bad("qkv_bias", "set either attention_bias (q, k, v and o biases) or qkv_bias (q, k and v only), not both");
  if (sliding_window < 0)
    bad("sliding_window", "must be >= 0 (0: no window), got " + std::to_string(sliding_window));
}

void SamplingParams::validate(int64_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0)
    bad("temperature", "must be a finite number >= 0, got " + std::to_string(temperature));
  if (top_k < 0) bad("top_k", "must be >= 0 (0 disables it), got " + std::to_string(top_k));
  if (!(top_p > 0 && top_p <= 1)) bad("top_p", "must be in (0, 1], got " + std::to_string(top_p));
  positive("max_tokens", max_tokens);
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    bad("logprobs", "must be none or in [0, " + std::to_string(kMaxLogprobs) + "], got " + std::to_string(logprobs));
  for (int32_t id : stop_token_ids) {
    if (id < 0) bad("stop_token_ids", "token ids must be >= 0, got " + std::to_string(id));
    if (vocab_size > 0 && id >= vocab_size)
      bad("stop_token_ids", "token id " + std::to_string(id) + " is outside the vocabulary (size " +
                                std::to_string(vocab_size) + ")");
  }
}

void EngineConfig::validate() const {
  if (mode != "ar" && mode != "sd" && mode != "ssd")
    bad("mode", "must be 'ar', 'sd' or 'ssd', got '" + mode + "'");
  if (max_model_len < 0)
    bad("max_model_len", "must be > 0 (or 0: what the model supports), got " + std::to_string(max_model_len));
  positive("max_batch", max_batch);
  positive("max_batched_tokens", max_batched_tokens);
  positive("kv_block_size", kv_block_size);
  if (!(std::isfinite(kv_cache_gib) && kv_cache_gib > 0))
    bad("kv_cache_gib", "must be a number of GiB > 0, got " + std::to_string(kv_cache_gib));
  if (kv_capacity_tokens < 0) bad("kv_capacity_tokens", "must be >= 0 (0: sized by kv_cache_gib)");
  if (kv_capacity_tokens > 0 && kv_capacity_tokens < max_model_len)
    bad("kv_capacity_tokens", "must hold at least one sequence of max_model_len (" +
                                  std::to_string(max_model_len) + ") tokens, got " +
                                  std::to_string(kv_capacity_tokens));
  if (dtype != "float32" && dtype != "bfloat16")
    bad("dtype", "must be 'float32' or 'bfloat16', got '" + dtype + "'");
  // Syntax and presence (this build, this machine): a CUDA device without a
  // GPU is refused here, before any weight is loaded.
  if (const std::string why = model::device_problem(target_device); !why.empty()) bad("target_device", why);
  if (mode != "ar")
    if (const std::string why = model::device_problem(draft_device); !why.empty()) bad("draft_device", why);
  if (mode == "ssd" && (target_device != "cpu" || draft_device != "cpu"))
    bad(target_device != "cpu" ? "target_device" : "draft_device",
        "mode 'ssd' runs on the CPU only in this version (ar and sd run on CUDA), got '" +
            (target_device != "cpu" ? target_device : draft_device) + "'");
  threads("target_threads", target_threads);
  threads("draft_threads", draft_threads);
  positive("k", k);
  if (k > 32) bad("k", "must be <= 32, got " + std::to_string(k));
  if (!fanout_list.empty()) {
    if (static_cast<int64_t>(fanout_list.size()) != k + 1)
      bad("fanout", "an explicit fan-out lists F_0..F_K, so k + 1 = " + std::to_string(k + 1) +
                        " values; got " + std::to_string(fanout_list.size()));
    int64_t sum = 0;
    for (int64_t f : fanout_list) {
      if (f < 0 || f > 256) bad("fanout", "every F_j must be in [0, 256], got " + std::to_string(f));
      sum += f;
    }
    if (sum < 1) bad("fanout", "the fan-out must prepare at least one branch (sum F_j >= 1)");
  }
  if (fanout_mode != "geometric" && fanout_mode != "confidence")
    bad("fanout", "must be 'geometric', 'confidence' or a list of k + 1 integers, got '" + fanout_mode + "'");
  if (fanout_budget < 0 || fanout_budget > 1024)
    bad("fanout_budget", "must be 'auto' (0) or an integer in [1, 1024], got " + std::to_string(fanout_budget));
  if (!fanout_list.empty() && fanout_budget != 0)
    bad("fanout_budget", "give either an explicit fan-out list or a budget, not both");
  if (!(saguaro_c >= 0 && saguaro_c <= 1))
    bad("saguaro_c", "must be in [0, 1] (1 is plain sampling), got " + std::to_string(saguaro_c));
  if (draft_matmul_min_rows < 0)
    bad("draft_matmul_min_rows", "must be >= 0 (0 turns the matmul path off), got " +
                                     std::to_string(draft_matmul_min_rows));
  if (fallback != "auto" && fallback != "neural" && fallback != "fast")
    bad("fallback", "must be 'auto', 'neural' or 'fast', got '" + fallback + "'");
  if (backend != "auto" && backend != "aten")
    bad("backend", "must be 'auto' or 'aten', got '" + backend + "'");
  if (coupling != "rejection" && coupling != "gumbel")
    bad("coupling", "must be 'rejection' or 'gumbel', got '" + coupling + "'");
}

int64_t kv_bytes_per_token(const ModelConfig& model) {
  return model.num_layers * 2 * model.num_kv_heads * model.head_dim * static_cast<int64_t>(sizeof(float));
}

void EngineConfig::resolve(const ModelConfig& target, const ModelConfig* draft) {
  validate();
  const int64_t max_pos = target.max_position_embeddings;
  if (max_model_len > max_pos)
    bad("max_model_len", std::to_string(max_model_len) + " exceeds the model's max_position_embeddings (" +
                             std::to_string(max_pos) + ")");
  const double per_token = static_cast<double>(kv_bytes_per_token(target) + (draft ? kv_bytes_per_token(*draft) : 0));
  const double memory = physical_memory();
  if (kv_capacity_tokens == 0) {
    const double budget = kv_cache_gib * kGiB;
    if (memory > 0 && budget > memory)
      bad("kv_cache_gib", gib(budget) + " exceeds this machine's memory (" + gib(memory) + ")");
    kv_capacity_tokens = static_cast<int64_t>(budget / per_token);
    if (kv_capacity_tokens < kv_block_size)
      bad("kv_cache_gib", gib(budget) + " holds " + std::to_string(kv_capacity_tokens) + " tokens (" +
                              std::to_string(static_cast<int64_t>(per_token)) +
                              " bytes each), less than one KV block");
    if (max_model_len == 0 && kv_capacity_tokens < max_pos) {
      SSD_LOG_WARNING("max_model_len: the model supports " << max_pos << " positions, but kv_cache_gib ("
                      << kv_cache_gib << ") holds " << kv_capacity_tokens << " tokens; max_model_len is "
                      << kv_capacity_tokens << " (raise kv_cache_gib for more)");
      max_model_len = kv_capacity_tokens;
    }
    if (max_model_len > kv_capacity_tokens)
      bad("kv_cache_gib", gib(budget) + " holds " + std::to_string(kv_capacity_tokens) +
                              " tokens, fewer than max_model_len (" + std::to_string(max_model_len) +
                              "); raise kv_cache_gib or lower max_model_len");
  } else {
    const double need = static_cast<double>(kv_capacity_tokens) * per_token;
    if (memory > 0 && need > memory)
      bad("kv_capacity_tokens", std::to_string(kv_capacity_tokens) + " tokens need " + gib(need) +
                                    " of KV cache, more than this machine's memory (" + gib(memory) + ")");
  }
  if (max_model_len == 0) max_model_len = std::min(max_pos, kv_capacity_tokens);
  validate();
}

int64_t EngineConfig::num_kv_blocks() const {
  if (kv_capacity_tokens <= 0) throw std::logic_error("EngineConfig::num_kv_blocks before resolve()");
  return (kv_capacity_tokens + kv_block_size - 1) / kv_block_size;
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    default: return "none";
  }
}

}  // namespace ssd
