#include "checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>

#include "safetensors.h"

namespace ssd::model {

namespace fs = std::filesystem;
using json::Value;
using safetensors::Shape;
using safetensors::shape_text;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSupported = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM";
// Tensors some checkpoints carry that the model recomputes; never loaded.
constexpr std::string_view kIgnoredSuffix = "rotary_emb.inv_freq";

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

// ------------------------------------------------------------------ json files

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Value read_json_object(const fs::path& path) {
  Value v = json::parse(read_file(path), path.string());
  if (!v.is_object()) fail(path.string() + " does not hold a JSON object");
  return v;
}

// ---------------------------------------------------------------- config.json

// nullptr when the key is absent or null: transformers treats a null as the default.
const Value* member(const Value& obj, std::string_view key) {
  const Value* v = obj.find(key);
  return v && !v->is_null() ? v : nullptr;
}

int64_t positive_int(const Value& cfg, const char* key, const std::string& source,
                     std::optional<int64_t> fallback = std::nullopt) {
  const Value* v = member(cfg, key);
  if (!v) {
    if (!fallback) fail(source + " has no '" + key + "'");
    return *fallback;
  }
  if (!v->is_int() || v->as_int() <= 0)
    fail(source + ": '" + key + "' must be a positive integer, got " + v->dump());
  return v->as_int();
}

// `fallback` when `v` is nullptr (the key is absent); anything but a number, null included, is an error.
double number(const Value* v, double fallback, const char* key, const std::string& source) {
  if (!v) return fallback;
  if (!v->is_number()) fail(source + ": '" + key + "' must be a number, got " + v->dump());
  return v->as_double();
}

bool flag(const Value& cfg, const char* key) {
  const Value* v = cfg.find(key);
  return v && v->truthy();
}

Architecture architecture(const Value& cfg, const std::string& source) {
  const Value* names = member(cfg, "architectures");
  if (!names) {  // fall back to model_type
    const Value* type = member(cfg, "model_type");
    const std::string t = type && type->is_string() ? type->as_string() : "";
    if (t == "llama") return Architecture::kLlama;
    if (t == "qwen2") return Architecture::kQwen2;
    if (t == "qwen3") return Architecture::kQwen3;
    if (t == "mistral") return Architecture::kMistral;
    fail(source + " names no architecture (no 'architectures', model_type=" +
         (type ? type->dump() : "null") + "); supported architectures: " + kSupported);
  }
  std::vector<const Value*> list;
  if (names->is_string()) list.push_back(names);
  if (names->is_array())
    for (const Value& n : names->as_array()) list.push_back(&n);
  if (list.empty()) fail(source + ": 'architectures' must be a non-empty list, got " + names->dump());
  std::string first_error;
  for (const Value* n : list) {
    try {
      return parse_architecture(n->is_string() ? n->as_string() : n->dump());
    } catch (const std::invalid_argument& e) {
      if (first_error.empty()) first_error = e.what();
    }
  }
  fail(source + ": " + first_error);
}

void check_supported_features(const Value& cfg, const std::string& source) {
  const Value* act = cfg.find("hidden_act");
  if (act && !(act->is_string() && act->as_string() == "silu"))
    fail(source + ": unsupported hidden_act " + act->dump() + " (only 'silu')");
}

// The window of sliding-window attention (0: none), as transformers decides
// it. Mistral windows every layer when sliding_window is set. Qwen2/Qwen3
// window only when use_sliding_window is true, and then the layers that
// layer_types marks "sliding_attention" (by default those from
// max_window_layers on); the forward holds one window for all layers, so a
// mix of windowed and full layers is refused.
int64_t sliding_window(const Value& cfg, Architecture arch, int64_t num_layers, const std::string& source) {
  const bool qwen = arch == Architecture::kQwen2 || arch == Architecture::kQwen3;
  const bool used = arch == Architecture::kMistral || (qwen && flag(cfg, "use_sliding_window"));
  const Value* window = used ? member(cfg, "sliding_window") : nullptr;
  if (window && !(window->is_int() && window->as_int() > 0))
    fail(source + ": 'sliding_window' must be a positive integer or null, got " + window->dump());
  const int64_t w = window ? window->as_int() : 0;
  if (arch == Architecture::kMistral) return w;  // transformers' Mistral ignores layer_types
  const bool enabled = w > 0;
  std::vector<bool> sliding(static_cast<size_t>(num_layers), false);
  const Value* types = member(cfg, "layer_types");
  if (types && types->truthy()) {
    if (!types->is_array() || static_cast<int64_t>(types->as_array().size()) != num_layers)
      fail(source + ": 'layer_types' must be a list of num_hidden_layers (" + std::to_string(num_layers) +
           ") layer types, got " + types->dump());
    for (size_t l = 0; l < sliding.size(); ++l) {
      const Value& t = types->as_array()[l];
      const std::string name = t.is_string() ? t.as_string() : "";
      if (name == "sliding_attention" && enabled) sliding[l] = true;
      else if (name != "full_attention" && name != "sliding_attention")
        fail(source + ": unsupported layer type " + t.dump() + " in 'layer_types' (supported: " +
             "'full_attention', 'sliding_attention')");
    }
  } else if (enabled) {
    const Value* from = member(cfg, "max_window_layers");
    if (from && !(from->is_int() && from->as_int() >= 0))
      fail(source + ": 'max_window_layers' must be an integer >= 0, got " + from->dump());
    const int64_t first = from ? from->as_int() : 28;  // transformers' default
    for (int64_t l = first; l < num_layers; ++l) sliding[static_cast<size_t>(l)] = true;
  }
  const auto windowed = std::count(sliding.begin(), sliding.end(), true);
  if (windowed == 0) return 0;
  if (windowed < num_layers)
    fail(source + ": use_sliding_window is true with the window on " + std::to_string(windowed) + " of " +
         std::to_string(num_layers) + " layers (max_window_layers / layer_types); sliding-window attention "
         "on only some layers is not supported");
  return w;
}

// rope_theta and llama3 scaling from rope_parameters (transformers 5) or the
// legacy rope_theta / rope_scaling keys; the newer layout wins.
void read_rope(const Value& cfg, const std::string& source, ModelConfig& c) {
  Value::Object merged;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const Value* v = member(cfg, key);
    if (!v) continue;
    if (!v->is_object()) fail(source + ": '" + key + "' must be an object, got " + v->dump());
    if (!v->as_object().empty() && !v->find("rope_type") && !v->find("type") && !v->find("rope_theta"))
      fail(source + ": per-layer-type '" + key + "' is not supported");
    for (const auto& [k, value] : v->as_object()) merged.insert_or_assign(k, value);
  }
  const Value params(std::move(merged));
  const Value* theta = params.find("rope_theta");
  c.rope_theta = number(theta ? theta : cfg.find("rope_theta"), 10000.0, "rope_theta", source);
  const Value* type = params.find("rope_type");
  if (!type) type = params.find("type");
  if (!type || (type->is_string() && type->as_string() == "default")) return;
  if (!(type->is_string() && type->as_string() == "llama3"))
    fail(source + ": unsupported rope type " + type->dump() + " (supported: 'default', 'llama3')");
  const char* keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings"};
  for (const char* key : keys)
    if (!member(params, key)) fail(source + ": llama3 rope scaling lacks '" + key + "'");
  auto& rs = c.rope_scaling;
  rs.enabled = true;
  rs.factor = number(params.find(keys[0]), 0, keys[0], source);
  rs.low_freq_factor = number(params.find(keys[1]), 0, keys[1], source);
  rs.high_freq_factor = number(params.find(keys[2]), 0, keys[2], source);
  rs.original_max_position_embeddings =
      static_cast<int64_t>(number(params.find(keys[3]), 0, keys[3], source));  // int() truncates
}

int64_t head_dim(const Value& cfg, int64_t hidden, int64_t heads, const std::string& source) {
  if (member(cfg, "head_dim")) return positive_int(cfg, "head_dim", source);
  if (hidden % heads != 0)
    fail(source + ": hidden_size (" + std::to_string(hidden) + ") is not divisible by num_attention_heads (" +
         std::to_string(heads) + ") and no head_dim is given");
  return hidden / heads;
}

// ---------------------------------------------------------------- weight names

bool ignorable(const std::string& name, const ModelConfig& c) {
  if (name == "lm_head.weight" && c.tie_word_embeddings) return true;  // tied checkpoints may keep it
  return name.ends_with(kIgnoredSuffix);
}

// ------------------------------------------------------------------- weights

// Tensor name -> the safetensors file holding it: the single file, whose
// header lands in `headers`, or the shards of an index.
std::map<std::string, fs::path> tensor_files(const fs::path& dir,
                                             std::map<fs::path, safetensors::File>& headers) {
  std::map<std::string, fs::path> file_of;
  const fs::path single = dir / kSingleFile, index = dir / kIndexFile;
  if (fs::is_regular_file(single)) {
    const auto& file = headers.emplace(single, safetensors::read_header(single)).first->second;
    for (const auto& entry : file.tensors) file_of.emplace(entry.first, single);
    return file_of;
  }
  if (!fs::is_regular_file(index)) {
    bool torch_files = false;
    for (const auto& e : fs::directory_iterator(dir))
      torch_files = torch_files || e.path().extension() == ".bin" || e.path().extension() == ".pt";
    fail(dir.string() + " has no " + kSingleFile + " or " + kIndexFile +
         (torch_files ? " (only safetensors weights are supported, not PyTorch .bin/.pt files)" : ""));
  }
  const Value index_json = read_json_object(index);
  const Value* weight_map = index_json.find("weight_map");
  if (!weight_map || !weight_map->is_object() || weight_map->as_object().empty())
    fail(index.string() + " has no 'weight_map' object");
  std::set<std::string> shards;
  for (const auto& [name, shard] : weight_map->as_object()) {
    if (!shard.is_string()) fail(index.string() + ": 'weight_map' values must be file names");
    shards.insert(shard.as_string());
    file_of.emplace(name, dir / shard.as_string());
  }
  for (const auto& shard : shards)
    if (!fs::is_regular_file(dir / shard))
      fail(index.string() + " lists shard '" + shard + "', but " + (dir / shard).string() + " does not exist");
  return file_of;
}

WeightMap read_weights(const fs::path& dir, const ModelConfig& c, at::ScalarType dtype) {
  std::map<fs::path, safetensors::File> headers;
  const auto file_of = tensor_files(dir, headers);
  std::set<std::string> available;
  for (const auto& entry : file_of) available.insert(entry.first);
  check_weight_names(available, c, dir.string());
  const auto expected = expected_weight_shapes(c);
  std::map<fs::path, std::vector<const std::pair<std::string, Shape>*>> by_file;
  for (const auto& entry : expected) by_file[file_of.at(entry.first)].push_back(&entry);

  WeightMap weights;
  for (const auto& [path, entries] : by_file) {
    auto it = headers.find(path);
    if (it == headers.end()) it = headers.emplace(path, safetensors::read_header(path)).first;
    const safetensors::File& file = it->second;
    for (const auto* entry : entries)  // an index can name a tensor its shard lacks
      if (!file.tensors.count(entry->first)) fail(path.string() + ": missing tensor " + entry->first);
    std::ifstream in(path, std::ios::binary);
    for (const auto* entry : entries) {
      const auto& [name, shape] = *entry;
      const safetensors::TensorInfo& info = file.tensors.at(name);
      if (info.shape != shape)
        fail(path.string() + ": tensor " + name + " has shape " + shape_text(info.shape) + ", expected " +
             shape_text(shape));
      weights.emplace(name, safetensors::read_tensor(file, name, info, in).to(dtype).contiguous());
    }
  }
  return weights;
}

// ------------------------------------------------------------ special tokens

std::string id_error(const std::string& source, const char* key, const Value& value) {
  return source + ": '" + key + "' must be a token id or a list of them, got " + value.dump();
}

bool token_id(const Value& v) {
  return v.is_int() && v.as_int() >= 0 && v.as_int() <= std::numeric_limits<int32_t>::max();
}

// Appends an id or a list of ids (nulls skipped), keeping first appearances.
void append_ids(const Value* group, const std::string& source, std::vector<int32_t>& ids) {
  if (!group || group->is_null()) return;
  const Value::Array items = group->is_array() ? group->as_array() : Value::Array{*group};
  for (const Value& item : items) {
    if (item.is_null()) continue;
    if (!token_id(item)) fail(id_error(source, "eos_token_id", *group));
    const auto id = static_cast<int32_t>(item.as_int());
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
}

// Keeps the first bos id met; a null one counts as absent.
void take_bos(const Value* v, const std::string& source, std::optional<int32_t>& bos) {
  if (bos || !v || v->is_null()) return;
  if (!token_id(*v)) fail(source + ": 'bos_token_id' must be a token id, got " + v->dump());
  bos = static_cast<int32_t>(v->as_int());
}

}  // namespace

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kQwen2: return "Qwen2ForCausalLM";
    case Architecture::kQwen3: return "Qwen3ForCausalLM";
    case Architecture::kMistral: return "MistralForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

at::ScalarType weight_dtype(const std::string& name) {
  if (name == "float32") return at::kFloat;
  if (name == "bfloat16") return at::kBFloat16;
  fail("dtype: must be float32 or bfloat16, got '" + name + "'");
}

namespace {

// The weights of layer `l`, in load order.
void append_layer_weights(const ModelConfig& c, int64_t l, std::vector<std::pair<std::string, Shape>>& s) {
  const int64_t h = c.hidden_size, i = c.intermediate_size, d = c.head_dim;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  const std::string p = "model.layers." + std::to_string(l) + ".";
  const std::string attn = p + "self_attn.", mlp = p + "mlp.";
  s.insert(s.end(), {{p + "input_layernorm.weight", {h}},
                     {attn + "q_proj.weight", {q_out, h}},
                     {attn + "k_proj.weight", {kv_out, h}},
                     {attn + "v_proj.weight", {kv_out, h}},
                     {attn + "o_proj.weight", {h, q_out}},
                     {p + "post_attention_layernorm.weight", {h}},
                     {mlp + "gate_proj.weight", {i, h}},
                     {mlp + "up_proj.weight", {i, h}},
                     {mlp + "down_proj.weight", {h, i}}});
  if (c.attention_bias || c.qkv_bias)
    s.insert(s.end(), {{attn + "q_proj.bias", {q_out}}, {attn + "k_proj.bias", {kv_out}},
                       {attn + "v_proj.bias", {kv_out}}});
  if (c.attention_bias) s.push_back({attn + "o_proj.bias", {h}});
  if (c.mlp_bias)
    s.insert(s.end(), {{mlp + "gate_proj.bias", {i}}, {mlp + "up_proj.bias", {i}},
                       {mlp + "down_proj.bias", {h}}});
  if (c.qk_norm) s.insert(s.end(), {{attn + "q_norm.weight", {d}}, {attn + "k_norm.weight", {d}}});
}

// A config from a corrupt file may claim billions of layers: rather than list
// their weights, name the first one missing among the first layers.
[[noreturn]] void fail_too_many_layers(const std::set<std::string>& available, const ModelConfig& c,
                                       const std::string& source) {
  std::vector<std::pair<std::string, Shape>> layer = {{"model.embed_tokens.weight", {}}};
  for (int64_t l = 0;; ++l) {
    if (l > 0) layer.clear();
    append_layer_weights(c, l, layer);
    for (const auto& entry : layer)
      if (!available.count(entry.first))
        fail(source + ": missing tensor " + entry.first + " (the config's " + std::to_string(c.num_layers) +
             " layers need more tensors than the " + std::to_string(available.size()) + " there are)");
  }
}

}  // namespace

std::vector<std::pair<std::string, Shape>> expected_weight_shapes(const ModelConfig& c) {
  std::vector<std::pair<std::string, Shape>> s = {{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}}};
  for (int64_t l = 0; l < c.num_layers; ++l) append_layer_weights(c, l, s);
  s.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return s;
}

void check_weight_names(const std::set<std::string>& available, const ModelConfig& c,
                        const std::string& source) {
  std::vector<std::pair<std::string, Shape>> first_layer;
  append_layer_weights(c, 0, first_layer);
  if (static_cast<uint64_t>(c.num_layers) > available.size() / first_layer.size())
    fail_too_many_layers(available, c, source);
  std::vector<std::string> missing, unexpected;
  std::set<std::string> wanted;
  for (const auto& [name, shape] : expected_weight_shapes(c)) {
    wanted.insert(name);
    if (!available.count(name)) missing.push_back(name);
  }
  for (const auto& name : available)  // sorted: the first reported is the same on every run
    if (!wanted.count(name) && !ignorable(name, c)) unexpected.push_back(name);
  auto more = [](const std::vector<std::string>& v) {
    return v.size() > 1 ? " (and " + std::to_string(v.size() - 1) + " more)" : std::string();
  };
  if (!missing.empty()) fail(source + ": missing tensor " + missing[0] + more(missing));
  if (!unexpected.empty())
    fail(source + ": unexpected tensor " + unexpected[0] + more(unexpected) + " for a " +
         architecture_name(c.architecture) + " with this config");
}

ModelConfig parse_model_config(const Value& cfg, const std::string& source) {
  if (!cfg.is_object()) fail(source + " does not hold a JSON object");
  ModelConfig c;
  c.architecture = architecture(cfg, source);
  const Architecture arch = c.architecture;
  const bool qwen3 = arch == Architecture::kQwen3;
  const bool qwen = qwen3 || arch == Architecture::kQwen2;
  c.hidden_size = positive_int(cfg, "hidden_size", source);
  c.num_heads = positive_int(cfg, "num_attention_heads", source);
  c.num_kv_heads = positive_int(cfg, "num_key_value_heads", source, c.num_heads);
  check_supported_features(cfg, source);
  read_rope(cfg, source, c);
  c.vocab_size = positive_int(cfg, "vocab_size", source);
  c.intermediate_size = positive_int(cfg, "intermediate_size", source);
  c.num_layers = positive_int(cfg, "num_hidden_layers", source);
  c.head_dim = head_dim(cfg, c.hidden_size, c.num_heads, source);
  c.rms_norm_eps = number(cfg.find("rms_norm_eps"), 1e-6, "rms_norm_eps", source);
  c.tie_word_embeddings = flag(cfg, "tie_word_embeddings");
  // transformers' defaults when config.json omits the key.
  const int64_t default_positions = qwen ? 32768 : arch == Architecture::kMistral ? 4096 * 32 : 2048;
  c.max_position_embeddings = positive_int(cfg, "max_position_embeddings", source, default_positions);
  // The bias layout is fixed by the architecture except in Llama and Qwen3:
  // Qwen2 has q, k, v biases and none on o, Mistral none at all.
  c.attention_bias = (arch == Architecture::kLlama || qwen3) && flag(cfg, "attention_bias");
  c.qkv_bias = arch == Architecture::kQwen2;
  c.mlp_bias = arch == Architecture::kLlama && flag(cfg, "mlp_bias");
  c.qk_norm = qwen3;
  c.sliding_window = sliding_window(cfg, arch, c.num_layers, source);
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(source + ": " + e.what());
  }
  return c;
}

Checkpoint load_checkpoint(const std::string& dir_name, at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16)
    fail(std::string("dtype: must be float32 or bfloat16, got ") + c10::toString(dtype));
  const fs::path dir(dir_name);
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail("model path does not exist: " + dir_name);
  if (!fs::is_directory(dir, ec)) fail(dir_name + " is not a model directory (with config.json)");
  const fs::path config_path = dir / "config.json";
  if (!fs::is_regular_file(config_path, ec))
    fail(dir_name + " has no config.json (not a HuggingFace model directory)");

  const Value raw = read_json_object(config_path);
  Checkpoint ckpt;
  ckpt.config = parse_model_config(raw, config_path.string());
  // generation_config.json is what transformers' generate() reads, so its ids come first.
  const fs::path generation_path = dir / "generation_config.json";
  if (fs::is_regular_file(generation_path, ec)) {
    const Value generation = read_json_object(generation_path);
    append_ids(generation.find("eos_token_id"), generation_path.string(), ckpt.eos_token_ids);
    take_bos(generation.find("bos_token_id"), generation_path.string(), ckpt.bos_token_id);
  }
  append_ids(raw.find("eos_token_id"), config_path.string(), ckpt.eos_token_ids);
  take_bos(raw.find("bos_token_id"), config_path.string(), ckpt.bos_token_id);
  ckpt.weights = read_weights(dir, ckpt.config, dtype);  // last: the slow part
  return ckpt;
}

}  // namespace ssd::model
