// The one loader of HuggingFace model directories: config.json, the
// safetensors weights (one file or a sharded index) and the special token ids
// the checkpoint's metadata names. The C++ program ssd_generate calls it
// directly; Python reaches it through ssd._C.load_checkpoint and adds only
// what needs the tokenizer (python/ssd/models/hf.py).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "json.h"
#include "model.h"
#include "ssd/config.h"

namespace ssd::model {

struct Checkpoint {
  ModelConfig config;
  WeightMap weights;  ///< HF names; lm_head.weight absent when tied
  /// Metadata ids in order of first appearance: generation_config.json's
  /// eos_token_id, then config.json's. The Python loader appends the
  /// tokenizer's ids after these (models/loaded.py: end_of_sequence_ids).
  std::vector<int32_t> eos_token_ids;
  /// The first integer bos_token_id of generation_config.json, config.json.
  std::optional<int32_t> bos_token_id;
};

/// Loads `dir` with every weight converted to `dtype` (float32 or bfloat16).
/// Throws std::invalid_argument naming the file (and tensor) at fault.
Checkpoint load_checkpoint(const std::string& dir, at::ScalarType dtype);

/// "float32" -> kFloat, "bfloat16" -> kBFloat16: the dtypes weights load in.
at::ScalarType weight_dtype(const std::string& name);

/// ModelConfig from a parsed config.json; `source` names the file in errors.
ModelConfig parse_model_config(const json::Value& config, const std::string& source);

/// The HF name: "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM" or "MistralForCausalLM".
const char* architecture_name(Architecture architecture);

/// HF name -> shape ([out, in] for matrices) of every weight `config` needs,
/// embeddings first, then layer by layer, then the final norm and lm_head.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weight_shapes(const ModelConfig& config);

/// Throws naming the first missing and the first unexpected tensor among
/// `available`. A tied checkpoint may still carry lm_head.weight, and
/// recomputed buffers (rotary inv_freq) may be present; both are ignored.
void check_weight_names(const std::set<std::string>& available, const ModelConfig& config,
                        const std::string& source);

}  // namespace ssd::model
