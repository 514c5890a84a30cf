// Plain configuration structs for the ssd core. Every struct has a validate()
// that throws std::invalid_argument naming the offending field; the Python
// layer mirrors these structs and surfaces the errors as ValueError.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ssd {

/// Architecture of a decoder-only model served by the core. All share one
/// forward; they differ only in the ModelConfig flags their checkpoints set.
enum class Architecture { kLlama, kQwen2, kQwen3, kMistral };

/// Parses "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM" or
/// "MistralForCausalLM"; throws on anything else.
Architecture parse_architecture(const std::string& name);

/// `llama3` rope scaling parameters (HF `rope_scaling` with rope_type llama3).
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

/// Shape and numerics of a model; mirrors python/ssd/models/config.py.
struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  /// Per-dimension divisors of the rotary inverse frequencies [head_dim / 2]
  /// (a GGUF file's rope_freqs tensor: llama3 scaling as llama.cpp stores it);
  /// empty: none. Excludes rope_scaling.
  std::vector<double> rope_freq_factors;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 2048;
  bool attention_bias = false;  ///< biases on q, k, v and o (Llama's attention_bias)
  bool qkv_bias = false;        ///< biases on q, k and v only (Qwen2); excludes attention_bias
  bool mlp_bias = false;
  bool qk_norm = false;
  /// > 0: every layer's query at position i attends keys j with
  /// i - sliding_window < j <= i (Mistral); 0: all keys j <= i.
  int64_t sliding_window = 0;

  void validate() const;
};

/// Per-request sampling settings. Logits are processed in one order everywhere:
/// temperature, then top-k, then top-p.
struct SamplingParams {
  double temperature = 1.0;  ///< 0 means greedy (argmax, ties to lowest id)
  int64_t top_k = 0;         ///< 0 disables
  double top_p = 1.0;        ///< 1 disables
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool has_seed = false;
  uint64_t seed = 0;
  /// -1: none; 0..kMaxLogprobs: report each token's log-probability under the
  /// distribution it was drawn from (processed: temperature, top-k, top-p) and
  /// that many of the most likely tokens there.
  int64_t logprobs = -1;

  /// Throws std::invalid_argument naming the field; vocab_size bounds stop ids.
  void validate(int64_t vocab_size) const;
};

struct TestingConfig;

/// The one engine configuration (mirrored by ssd.EngineConfig in Python).
/// Placements (docs/gpu.md): both models on the CPU; the target on a GPU with
/// the draft on the CPU, on the same GPU (its own stream) or on another GPU.
struct EngineConfig {
  std::string mode = "ar";  ///< "ar", "sd" or "ssd" (the last two use the draft fields)
  /// Prompt + generated tokens per request; 0: what the target supports
  /// (its max_position_embeddings), lowered with a warning to what the KV
  /// budget holds. An explicit value that does not fit is an error.
  int64_t max_model_len = 0;
  int64_t max_batch = 32;
  int64_t max_batched_tokens = 2048;  ///< token budget of one forward (prefill chunking)
  int64_t kv_block_size = 16;
  /// Memory of the KV caches (target and draft together), in GiB; on the CPU
  /// reserved, not touched (pages become resident as blocks are first used).
  /// 0 ("auto"): per device, a GPU's free memory after the weights loaded less
  /// kAutoKvMargin (shared by the caches on it), the CPU's kCpuAutoKvGiB.
  /// Checked against each device's free memory (the CPU's: its RAM).
  double kv_cache_gib = 4.0;
  int64_t kv_capacity_tokens = 0;     ///< KV slots per model; 0: from kv_cache_gib
  /// Weight storage: "float32", "bfloat16", a GGUF block format for the
  /// matrices ("q8_0", "q4_0", "q4_1") or "auto" (a GGUF file's own formats);
  /// the models are loaded in Python (ssd/models/quantized.py).
  std::string dtype = "float32";
  std::string draft_dtype;            ///< the draft's weight storage; "": dtype's
  /// Activations of products with quantized matrices: "int8" (quantized per
  /// 32-value block, kernels/cpu/quant.h) or "float32" (exactly the model of
  /// the dequantised weights).
  std::string quant_activations = "int8";
  std::string target_device = "cpu";
  int64_t target_threads = 1;
  std::string draft_device = "cpu";
  int64_t draft_threads = 1;
  int64_t k = 4;                       ///< draft tokens per round (sd / ssd)
  // ssd / SAGUARO
  std::vector<int64_t> fanout_list;    ///< explicit F_0..F_K; empty: fanout_mode decides
  /// Without a list: "geometric" (SAGUARO's F_j for every sequence) or
  /// "confidence" (greedy sequences take the budget's most likely outcomes by
  /// the draft's calibrated confidence; sampled ones stay geometric).
  std::string fanout_mode = "confidence";
  int64_t fanout_budget = 0;           ///< B = sum F_j; 0: auto (the tree fits in one verify)
  double saguaro_c = 1.0;              ///< C of SAGUARO sampling (1: plain sampling)
  std::string fallback = "auto";       ///< on a cache miss: "auto", "neural" or "fast"
  /// How sampled draws are coupled (every mode): "rejection" (the draft
  /// samples on its own, the target verifies by rejection sampling) or
  /// "gumbel" (keyed Gumbel-max noise shared by draft and target; the output
  /// is the autoregressive sample whatever the draft proposes).
  std::string coupling = "gumbel";
  /// sd/ssd: draft forwards over at least this many rows (the ssd tree, sd
  /// batches) use the bf16 pair kernels (AVX512-BF16); 0 turns them off.
  int64_t draft_matmul_min_rows = 4;
  /// false: the cuda backend's stock cuBLAS products (faster; greedy sd is
  /// then no longer token-identical to ar). The CPU is always batch-invariant.
  bool batch_invariant = true;
  /// The cuda backend replays a CUDA graph per forward shape (padded to a
  /// batch bucket: model/forward_shape.h) rather than launching each kernel;
  /// with batch_invariant the same logits either way. Ignored on the CPU.
  bool cuda_graphs = true;
  /// sd / ssd with the draft on the target's GPU: 0 (the default) runs the
  /// draft's kernels on every SM at a lower stream priority than the
  /// target's; in (0, 1) confines them to that share of the SMs (a CUDA green
  /// context; CUDA 12.5+ drivers). Refused for any other placement.
  double draft_sm_share = 0;
  /// The models' backend: "auto" (each device's own kernels) or "aten" (the
  /// reference over ATen ops; on the CPU it stands in for a device: logits
  /// stay in tensors and every round runs the device code path).
  std::string backend = "auto";
  /// The KV caches' element type: "float32", "bfloat16" (half the bytes;
  /// each K / V value rounded to nearest even as it is written, attention
  /// computes in fp32) or "auto": bfloat16 on a GPU, float32 on the CPU.
  std::string kv_cache_dtype = "auto";
  /// kv_cache_dtype as it applies to a cache on `device`: "float32" or "bfloat16".
  std::string kv_cache_dtype_on(const std::string& device) const;
  /// sd/ssd: each round verifies as many of its k proposals as the speed
  /// model says pays (0: an autoregressive step), and ssd builds trees only
  /// when they pay (runtime/adaptive_policy.h); false: k proposals every
  /// round and always trees (the fixed modes).
  bool adaptive = true;
  /// Ranks the target is split over (model/tensor_parallel.h): the target
  /// model given to the engine must be rank 0 of a group of this size; the
  /// engine leads it (the other ranks follow its forwards) and stops the
  /// followers at shutdown. ssd.LLM starts those ranks as processes.
  int64_t tensor_parallel_size = 1;
  /// How long a rank waits for the others inside a step (and a follower for
  /// rank 0 between steps) before the group counts as failed: a hung rank
  /// ends every request with an error within this time. An idle engine pings
  /// its followers every quarter of it.
  double tensor_parallel_timeout_s = 60.0;
  /// How the ranks meet (ssd.LLM): "spawn" (it starts ranks 1.. on this
  /// machine) or "env" (each rank is started by the user, e.g. torchrun, and
  /// reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
  std::string tensor_parallel_init = "spawn";

  void validate() const;
  /// The same, against testing.fake_devices (when set) instead of this machine.
  void validate(const TestingConfig& testing) const;
  /// Fills the automatic fields (max_model_len, kv_capacity_tokens) from the
  /// models and checks them against the models and each device's memory;
  /// call after the weights are on their devices. `draft` is null in mode
  /// "ar". Throws std::invalid_argument naming the field.
  void resolve(const ModelConfig& target, const ModelConfig* draft);
  void resolve(const ModelConfig& target, const ModelConfig* draft, const TestingConfig& testing);
  /// Number of KV blocks (call after resolve()).
  int64_t num_kv_blocks() const;
};

/// Upper bound of target_threads and draft_threads.
inline constexpr int64_t kMaxThreads = 1024;
/// Most alternatives SamplingParams::logprobs may ask for (OpenAI's limit).
inline constexpr int64_t kMaxLogprobs = 20;

/// Bytes of KV cache one token takes in a model (fp32 keys and values).
int64_t kv_bytes_per_token(const ModelConfig& model, const std::string& kv_dtype = "float32");

/// kv_cache_gib "auto": the CPU's budget, and the part of a GPU's free memory
/// left to activations and the ssd draft's tree blocks (which come on top of
/// the budget): max(1 GiB, 10 % of the device's total).
inline constexpr double kCpuAutoKvGiB = 4.0;
inline constexpr double kAutoKvMarginGiB = 1.0;
inline constexpr double kAutoKvMarginFraction = 0.10;

/// Free and total bytes of one device's memory (0: unknown).
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

/// A machine as the placement and KV budget checks see it.
struct MachineDevices {
  DeviceMemory host;               ///< the CPU (free = total: its physical memory)
  std::vector<DeviceMemory> cuda;  ///< cuda[i] is cuda:i; the size is the number of GPUs
};

/// Test-only switches, handed to the Engine explicitly (never read from the
/// environment, never part of EngineConfig). Each changes the engine on purpose.
struct TestingConfig {
  bool always_miss = false;  ///< ssd: every cache lookup misses and no trees are built
  /// ssd, fallback "auto": the fast and the neural kind answer misses in
  /// turn, one draft-worker batch each, instead of as the speed model picks
  /// from measured times; the auto law test then sees both kinds every run.
  bool auto_alternate = false;
  // The faults below are deliberately wrong, each on one path: they break
  // the output law there, and that path's law test must catch it.
  /// Verifies one-hot (fast fallback) proposals greedily at any temperature.
  bool fault_fast_argmax = false;
  /// After a preemption, the resumed sequence keys the draws of every later
  /// verification by the length it resumed at (its stream derived once at
  /// the resume and never advanced), so all its rounds repeat one set of draws.
  bool fault_resume_stream = false;
  /// ssd: a round verifying fewer proposals than its speculation holds
  /// (truncated by max_model_len or KV room) pairs them with the
  /// speculation's last q rows instead of its first: stale rows.
  bool fault_truncated_q = false;
  /// The verifier takes top-k and top-p from the first request it verifies
  /// and applies them to every later one, as if they were batch-wide.
  bool fault_batch_top_kp = false;
  /// ssd: the draft worker's thread ends at its first verification outcome,
  /// answering nothing, as if it had died; the engine must fail the affected
  /// requests with an error instead of waiting forever.
  bool fault_worker_dies = false;
  /// coupling "gumbel": the target draws every position with the noise of
  /// position 0, so a request's tokens are correlated.
  bool fault_shared_noise = false;
  /// The adaptive policy's lookahead forced: round r of a request verifies
  /// forced_lookahead[(step + request id) % size] proposals (clamped to
  /// [0, k]; ssd builds trees for every round), whatever the speed model
  /// says, so lookaheads switch within a request and differ across a batch.
  /// Empty: the policy (or the fixed mode) decides.
  std::vector<int64_t> forced_lookahead;
  /// Verifies only the leading proposals of a round that the target is sure
  /// to accept (p(x) >= q(x) at each, read off the round's own target
  /// logits), the rest of the round's proposals dropped: a lookahead chosen
  /// from the target's current logits (coupling "rejection", temperature > 0).
  bool fault_peek_target = false;
  /// ssd: the draft KV holds only this many blocks beyond the sequences'
  /// own (0: room for a full tree of every sequence), so trees run out.
  int64_t tree_blocks = 0;
  /// ssd: the draft worker waits this many milliseconds before answering
  /// each batch of verification outcomes, as a slow link between the devices
  /// would: a wait no part of the adaptive policy's step model measures.
  int64_t draft_answer_delay_ms = 0;
  /// Stands in for this machine's devices in EngineConfig::validate and
  /// resolve, so placements and KV budgets are checked without a GPU.
  std::optional<MachineDevices> fake_devices;
};

}  // namespace ssd
