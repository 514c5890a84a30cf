#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <sstream>
#include <string>
#include <vector>

#include "ssd/config.h"
#include "../model/backend.h"
#include "../model/device_memory.h"
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

// The devices the checks see: this machine's, or TestingConfig's fake ones.
class Machine {
 public:
  explicit Machine(const TestingConfig& testing) : fake_(testing.fake_devices ? &*testing.fake_devices : nullptr) {}

  int64_t cuda_count() const {
    return fake_ ? static_cast<int64_t>(fake_->cuda.size()) : model::cuda_device_count();
  }

  /// `device` canonical: "cpu" or "cuda:N" with N < cuda_count().
  DeviceMemory memory(const std::string& device) const {
    if (!fake_) return model::device_memory(device);
    return device == "cpu" ? fake_->host : fake_->cuda.at(std::stoul(device.substr(5)));
  }

 private:
  const MachineDevices* fake_;
};

// "" when `device` names one of the machine's devices, else why not.
std::string device_problem(const std::string& device, const Machine& machine) {
  std::string canonical;
  try {
    canonical = model::canonical_device(device);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (canonical == "cpu") return "";
  const int64_t count = machine.cuda_count();
  if (count == 0)
    return "device '" + device + "': no CUDA device is available (this torch build or this machine has no "
           "NVIDIA GPU); use 'cpu'";
  if (std::stoll(canonical.substr(5)) >= count)
    return "device '" + device + "': this machine has " + std::to_string(count) + " CUDA device" +
           (count == 1 ? "" : "s") + " (cuda:0..cuda:" + std::to_string(count - 1) + ")";
  return "";
}

// The KV caches on one device: the bytes a token takes in them, whose they are.
struct DeviceCaches {
  std::string device;  // canonical
  double per_token = 0;
  std::string holds;   // "target", "draft" or "target and draft"
};

// "" when `bytes` fit the device's memory (or it is unknown), else what they exceed.
std::string exceeded(double bytes, const std::string& device, const Machine& machine) {
  const DeviceMemory m = machine.memory(device);
  if (device == "cpu")
    return m.total_bytes > 0 && bytes > static_cast<double>(m.total_bytes)
               ? "this machine's memory (" + gib(static_cast<double>(m.total_bytes)) + ")"
               : "";
  return m.total_bytes > 0 && bytes > static_cast<double>(m.free_bytes)
             ? "the free memory of " + device + " (" + gib(static_cast<double>(m.free_bytes)) + " free of " +
                   gib(static_cast<double>(m.total_bytes)) + ")"
             : "";
}

// kv_cache_gib "auto" on one device: bytes for the caches on it.
double auto_budget(const DeviceCaches& caches, const Machine& machine) {
  if (caches.device == "cpu") return kCpuAutoKvGiB * kGiB;
  const DeviceMemory m = machine.memory(caches.device);
  if (m.total_bytes <= 0)
    bad("kv_cache_gib", "'auto' needs the free memory of " + caches.device +
                            ", which this build cannot read (ssd was built without CUDA); give a number of GiB");
  const double free = static_cast<double>(m.free_bytes), total = static_cast<double>(m.total_bytes);
  const double margin = std::max(kAutoKvMarginGiB * kGiB, kAutoKvMarginFraction * total);
  if (free <= margin)
    bad("kv_cache_gib", "'auto' leaves nothing for the " + caches.holds + " KV cache on " + caches.device + ": " +
                            gib(free) + " free of " + gib(total) + ", within the margin of " + gib(margin) +
                            " kept for activations; free memory there or give a number of GiB");
  return free - margin;
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

void EngineConfig::validate() const { validate(TestingConfig{}); }

void EngineConfig::validate(const TestingConfig& testing) const {
  if (mode != "ar" && mode != "sd" && mode != "ssd")
    bad("mode", "must be 'ar', 'sd' or 'ssd', got '" + mode + "'");
  if (max_model_len < 0)
    bad("max_model_len", "must be > 0 (or 0: what the model supports), got " + std::to_string(max_model_len));
  positive("max_batch", max_batch);
  positive("max_batched_tokens", max_batched_tokens);
  positive("kv_block_size", kv_block_size);
  if (!(std::isfinite(kv_cache_gib) && kv_cache_gib >= 0))
    bad("kv_cache_gib", "must be a number of GiB > 0 or 0 ('auto'), got " + std::to_string(kv_cache_gib));
  if (kv_capacity_tokens < 0) bad("kv_capacity_tokens", "must be >= 0 (0: sized by kv_cache_gib)");
  if (kv_capacity_tokens > 0 && kv_capacity_tokens < max_model_len)
    bad("kv_capacity_tokens", "must hold at least one sequence of max_model_len (" +
                                  std::to_string(max_model_len) + ") tokens, got " +
                                  std::to_string(kv_capacity_tokens));
  const auto storage = [&](const char* field, const std::string& value, bool empty_ok) {
    for (const char* name : {"float32", "bfloat16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "auto"})
      if (value == name) return;
    if (!(empty_ok && value.empty()))
      bad(field, std::string("must be 'float32', 'bfloat16', 'q8_0', 'q4_0', 'q4_1', 'q5_0', 'q5_1' or 'auto'") +
                     (empty_ok ? " ('' for dtype's)" : "") + ", got '" + value + "'");
  };
  storage("dtype", dtype, false);
  storage("draft_dtype", draft_dtype, true);
  if (quant_activations != "int8" && quant_activations != "float32")
    bad("quant_activations", "must be 'int8' or 'float32', got '" + quant_activations + "'");
  // Syntax and presence (this build, this machine): a CUDA device without a
  // GPU is refused here, before any weight is loaded.
  const Machine machine(testing);
  if (const std::string why = device_problem(target_device, machine); !why.empty()) bad("target_device", why);
  if (mode == "ar") {
    if (draft_device != "cpu")
      bad("draft_device", "mode 'ar' runs no draft model, so draft_device must stay 'cpu', got '" + draft_device +
                              "' (modes 'sd' and 'ssd' place a draft)");
  } else {
    if (const std::string why = device_problem(draft_device, machine); !why.empty()) bad("draft_device", why);
    if (model::canonical_device(target_device) == "cpu" && model::canonical_device(draft_device) != "cpu")
      bad("draft_device", "'" + draft_device + "' with target_device 'cpu' is not a supported placement: a GPU "
                          "draft needs the target on a GPU (the draft on the CPU, on the target's GPU or on "
                          "another GPU), or both on the CPU");
  }
  if (!(draft_sm_share >= 0 && draft_sm_share < 1))
    bad("draft_sm_share", "must be in [0, 1) (0: the draft shares every SM at a lower priority), got " +
                              std::to_string(draft_sm_share));
  if (draft_sm_share > 0 && (mode == "ar" || model::canonical_device(draft_device) == "cpu" ||
                             model::canonical_device(draft_device) != model::canonical_device(target_device)))
    bad("draft_sm_share", "confines a draft on the target's GPU to a share of its SMs, so it needs mode 'sd' or "
                          "'ssd' with draft_device = target_device on a GPU (here mode '" + mode +
                          "', target_device '" + target_device + "', draft_device '" + draft_device + "')");
  threads("target_threads", target_threads);
  threads("draft_threads", draft_threads);
  positive("tensor_parallel_size", tensor_parallel_size);
  if (!(tensor_parallel_timeout_s > 0) || !std::isfinite(tensor_parallel_timeout_s))
    bad("tensor_parallel_timeout_s", "must be a number of seconds > 0, got " + std::to_string(tensor_parallel_timeout_s));
  if (tensor_parallel_init != "spawn" && tensor_parallel_init != "env")
    bad("tensor_parallel_init", "must be 'spawn' or 'env', got '" + tensor_parallel_init + "'");
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
  if (kv_cache_dtype != "auto" && kv_cache_dtype != "float32" && kv_cache_dtype != "bfloat16")
    bad("kv_cache_dtype", "must be 'auto', 'float32' or 'bfloat16', got '" + kv_cache_dtype + "'");
  if (coupling != "rejection" && coupling != "gumbel")
    bad("coupling", "must be 'rejection' or 'gumbel', got '" + coupling + "'");
}

int64_t kv_bytes_per_token(const ModelConfig& model, const std::string& kv_dtype) {
  return model.num_layers * 2 * model.num_kv_heads * model.head_dim * (kv_dtype == "bfloat16" ? 2 : 4);
}

std::string EngineConfig::kv_cache_dtype_on(const std::string& device) const {
  if (kv_cache_dtype != "auto") return kv_cache_dtype;
  return model::canonical_device(device) == "cpu" ? "float32" : "bfloat16";
}

void EngineConfig::resolve(const ModelConfig& target, const ModelConfig* draft) {
  resolve(target, draft, TestingConfig{});
}

void EngineConfig::resolve(const ModelConfig& target, const ModelConfig* draft, const TestingConfig& testing) {
  validate(testing);
  const Machine machine(testing);
  const int64_t max_pos = target.max_position_embeddings;
  if (max_model_len > max_pos)
    bad("max_model_len", std::to_string(max_model_len) + " exceeds the model's max_position_embeddings (" +
                             std::to_string(max_pos) + ")");
  // Both caches hold kv_capacity_tokens slots; each lives on its model's device.
  std::vector<DeviceCaches> devices{{model::canonical_device(target_device),
                                     static_cast<double>(kv_bytes_per_token(target, kv_cache_dtype_on(target_device))),
                                     "target"}};
  if (draft) {
    const std::string device = model::canonical_device(draft_device);
    const auto per_token = static_cast<double>(kv_bytes_per_token(*draft, kv_cache_dtype_on(draft_device)));
    if (device == devices[0].device) {
      devices[0].per_token += per_token;
      devices[0].holds = "target and draft";
    } else {
      devices.push_back({device, per_token, "draft"});
    }
  }
  double per_token = 0;
  for (const DeviceCaches& d : devices) per_token += d.per_token;
  // A message's note of the `bytes` on d's device, when the caches span two.
  auto share = [&](const DeviceCaches& d, double bytes) {
    if (devices.size() == 1) return std::string();
    return " (" + gib(bytes) + " of it for the " + d.holds + " on " + d.device + ")";
  };
  if (kv_capacity_tokens == 0) {
    std::string budget_name;  // kv_cache_gib as the messages name it
    if (kv_cache_gib > 0) {
      const double budget = kv_cache_gib * kGiB;
      budget_name = gib(budget);
      for (const DeviceCaches& d : devices) {
        const double bytes = budget * d.per_token / per_token;
        if (const std::string limit = exceeded(bytes, d.device, machine); !limit.empty())
          bad("kv_cache_gib", budget_name + share(d, bytes) + " exceeds " + limit);
      }
      kv_capacity_tokens = static_cast<int64_t>(budget / per_token);
    } else {
      // "auto": as many tokens as the tightest device holds.
      double tokens = std::numeric_limits<double>::infinity();
      for (const DeviceCaches& d : devices) {
        const double bytes = auto_budget(d, machine);
        if (const std::string limit = exceeded(bytes, d.device, machine); !limit.empty())
          bad("kv_cache_gib",
              "'auto' (" + gib(bytes) + " for the " + d.holds + " on " + d.device + ") exceeds " + limit);
        tokens = std::min(tokens, std::floor(bytes / d.per_token));
      }
      kv_capacity_tokens = static_cast<int64_t>(tokens);
      budget_name = "'auto' (" + gib(static_cast<double>(kv_capacity_tokens) * per_token) + ")";
    }
    if (kv_capacity_tokens < kv_block_size)
      bad("kv_cache_gib", budget_name + " holds " + std::to_string(kv_capacity_tokens) + " tokens (" +
                              std::to_string(static_cast<int64_t>(per_token)) +
                              " bytes each), less than one KV block");
    if (max_model_len == 0 && kv_capacity_tokens < max_pos) {
      SSD_LOG_WARNING("max_model_len: the model supports " << max_pos << " positions, but kv_cache_gib ("
                      << budget_name << ") holds " << kv_capacity_tokens << " tokens; max_model_len is "
                      << kv_capacity_tokens << " (raise kv_cache_gib for more)");
      max_model_len = kv_capacity_tokens;
    }
    if (max_model_len > kv_capacity_tokens)
      bad("kv_cache_gib", budget_name + " holds " + std::to_string(kv_capacity_tokens) +
                              " tokens, fewer than max_model_len (" + std::to_string(max_model_len) +
                              "); raise kv_cache_gib or lower max_model_len");
  } else {
    const double need = static_cast<double>(kv_capacity_tokens) * per_token;
    for (const DeviceCaches& d : devices) {
      const double bytes = static_cast<double>(kv_capacity_tokens) * d.per_token;
      if (const std::string limit = exceeded(bytes, d.device, machine); !limit.empty())
        bad("kv_capacity_tokens", std::to_string(kv_capacity_tokens) + " tokens need " + gib(need) +
                                      " of KV cache" + share(d, bytes) + ", more than " + limit);
    }
  }
  if (max_model_len == 0) max_model_len = std::min(max_pos, kv_capacity_tokens);
  validate(testing);
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
