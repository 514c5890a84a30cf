// Loads a HuggingFace model directory without Python: config.json, the
// safetensors weights (one file or a sharded index) and the eos token ids.
// Mirrors python/ssd/models/hf.py rule for rule, so a directory loads into the
// same ModelConfig and the same weights from C++ and from Python.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "json.h"
#include "model.h"
#include "ssd/config.h"

namespace ssd::model {

struct Checkpoint {
  ModelConfig config;
  WeightMap weights;                   ///< HF names; lm_head.weight absent when tied
  std::vector<int32_t> eos_token_ids;  ///< generation_config.json, then config.json
};

/// Loads `dir` with every weight converted to `dtype` (float32 or bfloat16).
/// Throws std::invalid_argument naming the file (and tensor) at fault.
Checkpoint load_checkpoint(const std::string& dir, at::ScalarType dtype);

/// ModelConfig from a parsed config.json; `source` names the file in errors.
ModelConfig parse_model_config(const json::Value& config, const std::string& source);

}  // namespace ssd::model
