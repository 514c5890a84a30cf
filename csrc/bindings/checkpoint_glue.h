// ssd._C's view of the HuggingFace checkpoint loader (model/checkpoint.h):
// Python loads HF directories through it and checks GGUF weights against the
// same weight list, so each rule exists once, in C++. Included by module.cpp
// only; `config_from` is module.cpp's dict -> ModelConfig conversion.
#pragma once

#include <torch/extension.h>

#include <pybind11/stl.h>

#include <set>
#include <string>

#include "../model/checkpoint.h"

namespace ssd::checkpoint_glue {

namespace py = pybind11;

// The inverse of module.cpp's model_config_from: the fields of
// python/ssd/models/config.py's ModelConfig, rope_scaling and rope_freq_factors None
// when absent.
inline py::dict model_config_dict(const ModelConfig& c) {
  py::dict d;
  d["architecture"] = model::architecture_name(c.architecture);
  d["vocab_size"] = c.vocab_size;
  d["hidden_size"] = c.hidden_size;
  d["intermediate_size"] = c.intermediate_size;
  d["num_layers"] = c.num_layers;
  d["num_heads"] = c.num_heads;
  d["num_kv_heads"] = c.num_kv_heads;
  d["head_dim"] = c.head_dim;
  d["rms_norm_eps"] = c.rms_norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["rope_scaling"] = py::none();
  if (c.rope_scaling.enabled) {
    py::dict rs;
    rs["factor"] = c.rope_scaling.factor;
    rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    rs["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
    d["rope_scaling"] = rs;
  }
  d["tie_word_embeddings"] = c.tie_word_embeddings;
  d["max_position_embeddings"] = c.max_position_embeddings;
  d["attention_bias"] = c.attention_bias;
  d["qkv_bias"] = c.qkv_bias;
  d["mlp_bias"] = c.mlp_bias;
  d["qk_norm"] = c.qk_norm;
  d["sliding_window"] = c.sliding_window;
  d["rope_freq_factors"] = c.rope_freq_factors.empty() ? py::object(py::none()) : py::cast(c.rope_freq_factors);
  return d;
}

inline py::dict load_checkpoint(const std::string& path, const std::string& dtype) {
  const at::ScalarType weight_dtype = model::weight_dtype(dtype);
  model::Checkpoint ckpt;
  {
    py::gil_scoped_release release;  // reading and converting gigabytes needs no Python
    ckpt = model::load_checkpoint(path, weight_dtype);
  }
  py::dict weights;  // in expected_weight_shapes' order, so iteration order is stable
  for (const auto& entry : model::expected_weight_shapes(ckpt.config))
    weights[py::str(entry.first)] = ckpt.weights.at(entry.first);
  py::dict out;
  out["config"] = model_config_dict(ckpt.config);
  out["weights"] = weights;
  out["eos_token_ids"] = ckpt.eos_token_ids;
  out["bos_token_id"] = ckpt.bos_token_id ? py::object(py::int_(*ckpt.bos_token_id)) : py::object(py::none());
  return out;
}

inline void bind(py::module_& m, ModelConfig (*config_from)(const py::dict&)) {
  m.def("load_checkpoint", &load_checkpoint, py::arg("path"), py::arg("dtype"),
        "Loads a HuggingFace directory: {'config': ModelConfig fields, 'weights': {HF name: CPU tensor "
        "in dtype ('float32' or 'bfloat16')}, 'eos_token_ids': [...], 'bos_token_id': int or None}. "
        "ValueError names the file (and tensor) at fault.");
  m.def(
      "expected_weight_shapes",
      [config_from](const py::dict& config) { return model::expected_weight_shapes(config_from(config)); },
      py::arg("config"), "[(HF name, shape)] of every weight a ModelConfig dict needs, in load order.");
  m.def(
      "check_weight_names",
      [config_from](const std::set<std::string>& names, const py::dict& config, const std::string& source) {
        model::check_weight_names(names, config_from(config), source);
      },
      py::arg("names"), py::arg("config"), py::arg("source"),
      "ValueError, led by `source`, for a missing or an unexpected tensor name.");
}

}  // namespace ssd::checkpoint_glue
