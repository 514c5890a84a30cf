#include "checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

namespace ssd::model {

namespace fs = std::filesystem;
using json::Value;

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kSupported = "LlamaForCausalLM, Qwen3ForCausalLM";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the limit the safetensors library enforces
// Tensors some checkpoints carry that the model recomputes; never loaded.
constexpr std::string_view kIgnoredSuffix = "rotary_emb.inv_freq";

using Shape = std::vector<int64_t>;

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

const char* architecture_name(Architecture a) {
  return a == Architecture::kQwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
}

// ------------------------------------------------------------------ json files

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

Value parse_json(std::string_view text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const std::invalid_argument& e) {
    fail("cannot read " + source + ": " + e.what());
  }
}

Value read_json_object(const fs::path& path) {
  Value v = parse_json(read_file(path), path.string());
  if (!v.is_object()) fail(path.string() + " does not hold a JSON object");
  return v;
}

// ---------------------------------------------------------------- config.json

// Python's `cfg.get(key)`: nullptr when the key is absent or null.
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

// Python's float(value) with a default: `v` nullptr means absent (a null is an error).
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
    if (t == "qwen3") return Architecture::kQwen3;
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
  if (flag(cfg, "use_sliding_window")) fail(source + ": sliding-window attention is not supported");
  const Value* types = cfg.find("layer_types");
  if (!types || !types->truthy()) return;
  if (!types->is_array()) fail(source + ": 'layer_types' must be a list, got " + types->dump());
  std::set<std::string> other;
  for (const Value& t : types->as_array())
    if (!(t.is_string() && t.as_string() == "full_attention")) other.insert(t.dump());
  if (other.empty()) return;
  std::string listed;
  for (const auto& t : other) listed += (listed.empty() ? "" : ", ") + t;
  fail(source + ": unsupported layer types [" + listed + "] (only 'full_attention')");
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

// HF name -> shape of every weight `c` needs, in python's canonical order
// (python/ssd/models/weights.py: expected_shapes).
std::vector<std::pair<std::string, Shape>> expected_shapes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, i = c.intermediate_size, d = c.head_dim;
  const int64_t q_out = c.num_heads * d, kv_out = c.num_kv_heads * d;
  std::vector<std::pair<std::string, Shape>> s = {{"model.embed_tokens.weight", {c.vocab_size, h}}};
  for (int64_t l = 0; l < c.num_layers; ++l) {
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
    if (c.attention_bias)
      s.insert(s.end(), {{attn + "q_proj.bias", {q_out}}, {attn + "k_proj.bias", {kv_out}},
                         {attn + "v_proj.bias", {kv_out}}, {attn + "o_proj.bias", {h}}});
    if (c.mlp_bias)
      s.insert(s.end(), {{mlp + "gate_proj.bias", {i}}, {mlp + "up_proj.bias", {i}},
                         {mlp + "down_proj.bias", {h}}});
    if (c.qk_norm) s.insert(s.end(), {{attn + "q_norm.weight", {d}}, {attn + "k_norm.weight", {d}}});
  }
  s.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, h}});
  return s;
}

bool ignorable(const std::string& name, const ModelConfig& c) {
  if (name == "lm_head.weight" && c.tie_word_embeddings) return true;  // tied checkpoints may keep it
  return name.ends_with(kIgnoredSuffix);
}

// A missing or an unexpected tensor name is an error (weights.py: check_names).
void check_names(const std::map<std::string, fs::path>& available,
                 const std::vector<std::pair<std::string, Shape>>& expected, const ModelConfig& c,
                 const std::string& source) {
  std::vector<std::string> missing, unexpected;
  std::set<std::string> wanted;
  for (const auto& [name, shape] : expected) {
    wanted.insert(name);
    if (!available.count(name)) missing.push_back(name);
  }
  for (const auto& [name, file] : available)  // std::map: sorted, like python's sorted()
    if (!wanted.count(name) && !ignorable(name, c)) unexpected.push_back(name);
  auto more = [](const std::vector<std::string>& v) {
    return v.size() > 1 ? " (and " + std::to_string(v.size() - 1) + " more)" : std::string();
  };
  if (!missing.empty()) fail(source + ": missing tensor " + missing[0] + more(missing));
  if (!unexpected.empty())
    fail(source + ": unexpected tensor " + unexpected[0] + more(unexpected) + " for a " +
         architecture_name(c.architecture) + " with this config");
}

// ------------------------------------------------------------------ safetensors

// Valid in safetensors, but not a weight dtype the loader converts.
constexpr at::ScalarType kNotLoadable = at::ScalarType::Undefined;

struct Dtype {
  const char* name;
  uint64_t itemsize;
  at::ScalarType loadable;
};

constexpr Dtype kDtypes[] = {
    {"F32", 4, at::kFloat},        {"F16", 2, at::kHalf},         {"BF16", 2, at::kBFloat16},
    {"F64", 8, at::kDouble},       {"BOOL", 1, kNotLoadable},     {"U8", 1, kNotLoadable},
    {"I8", 1, kNotLoadable},       {"F8_E4M3", 1, kNotLoadable},  {"F8_E5M2", 1, kNotLoadable},
    {"I16", 2, kNotLoadable},      {"U16", 2, kNotLoadable},      {"I32", 4, kNotLoadable},
    {"U32", 4, kNotLoadable},      {"I64", 8, kNotLoadable},      {"U64", 8, kNotLoadable},
};

struct TensorInfo {
  const Dtype* dtype = nullptr;
  Shape shape;
  uint64_t begin = 0, end = 0;  // relative to the start of the data section
};

struct SafetensorsFile {
  fs::path path;
  uint64_t data_start = 0;
  std::map<std::string, TensorInfo> tensors;
};

const Value& field(const Value& entry, const char* key, const std::string& context) {
  const Value* v = entry.find(key);
  if (!v) fail(context + ": entry has no '" + key + "'");
  return *v;
}

TensorInfo tensor_info(const Value& entry, uint64_t data_size, const std::string& context) {
  if (!entry.is_object()) fail(context + ": entry must be an object, got " + entry.dump());
  TensorInfo info;
  const Value& dtype = field(entry, "dtype", context);
  for (const Dtype& d : kDtypes)
    if (dtype.is_string() && dtype.as_string() == d.name) info.dtype = &d;
  if (!info.dtype) fail(context + ": unknown dtype " + dtype.dump());

  const Value& shape = field(entry, "shape", context);
  auto bad_shape = [&] { fail(context + ": 'shape' must be a list of non-negative integers, got " + shape.dump()); };
  if (!shape.is_array()) bad_shape();
  uint64_t bytes = info.dtype->itemsize;
  for (const Value& dim : shape.as_array()) {
    if (!dim.is_int() || dim.as_int() < 0) bad_shape();
    const auto n = static_cast<uint64_t>(dim.as_int());
    if (n > 0 && bytes > std::numeric_limits<uint64_t>::max() / n) fail(context + ": shape is too large");
    bytes *= n;
    info.shape.push_back(dim.as_int());
  }

  const Value& offsets = field(entry, "data_offsets", context);
  const bool pair = offsets.is_array() && offsets.as_array().size() == 2 && offsets.as_array()[0].is_int() &&
                    offsets.as_array()[1].is_int() && offsets.as_array()[0].as_int() >= 0 &&
                    offsets.as_array()[0].as_int() <= offsets.as_array()[1].as_int();
  if (!pair) fail(context + ": 'data_offsets' must be [begin, end] with 0 <= begin <= end, got " + offsets.dump());
  info.begin = static_cast<uint64_t>(offsets.as_array()[0].as_int());
  info.end = static_cast<uint64_t>(offsets.as_array()[1].as_int());
  if (info.end - info.begin != bytes)
    fail(context + ": shape " + shape_text(info.shape) + " of " + info.dtype->name + " needs " +
         std::to_string(bytes) + " bytes, but data_offsets " + offsets.dump() + " span " +
         std::to_string(info.end - info.begin));
  if (info.end > data_size)
    fail(context + ": data_offsets " + offsets.dump() + " run past the end of the data (" +
         std::to_string(data_size) + " bytes; truncated file?)");
  return info;
}

// Reads and validates the header: [u64 little-endian N][N bytes of JSON][data].
SafetensorsFile read_safetensors_header(const fs::path& path) {
  const std::string where = path.string();
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) fail("cannot read safetensors file " + where + (ec ? ": " + ec.message() : ""));
  if (size < 8)
    fail(where + ": truncated safetensors file (" + std::to_string(size) +
         " bytes, less than the 8-byte header length)");
  unsigned char prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  if (n > kMaxHeaderBytes)
    fail(where + ": safetensors header length " + std::to_string(n) + " exceeds the 100 MB limit (corrupt file?)");
  if (n > size - 8)
    fail(where + ": truncated safetensors file: the header needs " + std::to_string(n) + " bytes, but only " +
         std::to_string(size - 8) + " follow the length");
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) fail("cannot read safetensors file " + where);

  const Value root = parse_json(header, where + " (safetensors header)");
  if (!root.is_object()) fail(where + ": safetensors header is not a JSON object");
  SafetensorsFile file{path, 8 + n, {}};
  for (const auto& [name, entry] : root.as_object()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(where + ": '__metadata__' must be an object of strings");
      for (const auto& [key, value] : entry.as_object())
        if (!value.is_string()) fail(where + ": '__metadata__' value of '" + key + "' is not a string");
      continue;
    }
    file.tensors.emplace(name, tensor_info(entry, size - 8 - n, where + ": tensor " + name));
  }
  return file;
}

at::Tensor read_tensor(const SafetensorsFile& file, const std::string& name, const TensorInfo& info,
                       std::ifstream& in) {
  const std::string where = file.path.string() + ": tensor " + name;
  if (info.dtype->loadable == kNotLoadable)
    fail(where + " has dtype " + info.dtype->name + " (supported: F32, F16, BF16, F64)");
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(info.dtype->loadable));
  in.seekg(static_cast<std::streamoff>(file.data_start + info.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(info.end - info.begin));
  if (!in) fail("cannot read " + where + " (file unreadable or changed while loading)");
  return t;
}

// Tensor name -> the safetensors file holding it: the single file, whose
// header lands in `headers`, or the shards of an index.
std::map<std::string, fs::path> tensor_files(const fs::path& dir, std::map<fs::path, SafetensorsFile>& headers) {
  std::map<std::string, fs::path> file_of;
  const fs::path single = dir / kSingleFile, index = dir / kIndexFile;
  if (fs::is_regular_file(single)) {
    const SafetensorsFile& file = headers.emplace(single, read_safetensors_header(single)).first->second;
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
  std::map<fs::path, SafetensorsFile> headers;
  const auto file_of = tensor_files(dir, headers);
  const auto expected = expected_shapes(c);
  check_names(file_of, expected, c, dir.string());
  std::map<fs::path, std::vector<const std::pair<std::string, Shape>*>> by_file;
  for (const auto& entry : expected) by_file[file_of.at(entry.first)].push_back(&entry);

  WeightMap weights;
  for (const auto& [path, entries] : by_file) {
    auto it = headers.find(path);
    if (it == headers.end()) it = headers.emplace(path, read_safetensors_header(path)).first;
    const SafetensorsFile& file = it->second;
    for (const auto* entry : entries)
      if (!file.tensors.count(entry->first)) fail(path.string() + ": missing tensor " + entry->first);
    std::ifstream in(path, std::ios::binary);
    for (const auto* entry : entries) {
      const auto& [name, shape] = *entry;
      const TensorInfo& info = file.tensors.at(name);
      if (info.shape != shape)
        fail(path.string() + ": tensor " + name + " has shape " + shape_text(info.shape) + ", expected " +
             shape_text(shape));
      weights.emplace(name, read_tensor(file, name, info, in).to(dtype).contiguous());
    }
  }
  return weights;
}

// ------------------------------------------------------------------- eos ids

// Appends an id or a list of ids (nulls skipped), keeping first appearances.
void append_ids(const Value* group, const std::string& source, std::vector<int32_t>& ids) {
  if (!group || group->is_null()) return;
  const Value::Array items = group->is_array() ? group->as_array() : Value::Array{*group};
  for (const Value& item : items) {
    if (item.is_null()) continue;
    if (!item.is_int() || item.as_int() < 0 || item.as_int() > std::numeric_limits<int32_t>::max())
      fail(source + ": 'eos_token_id' must be a token id or a list of them, got " + group->dump());
    const auto id = static_cast<int32_t>(item.as_int());
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
}

}  // namespace

ModelConfig parse_model_config(const Value& cfg, const std::string& source) {
  if (!cfg.is_object()) fail(source + " does not hold a JSON object");
  ModelConfig c;
  c.architecture = architecture(cfg, source);
  const bool qwen3 = c.architecture == Architecture::kQwen3;
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
  c.max_position_embeddings = positive_int(cfg, "max_position_embeddings", source, qwen3 ? 32768 : 2048);
  c.attention_bias = flag(cfg, "attention_bias");
  c.mlp_bias = !qwen3 && flag(cfg, "mlp_bias");  // Qwen3 has no MLP bias
  c.qk_norm = qwen3;
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
  ckpt.weights = read_weights(dir, ckpt.config, dtype);
  const fs::path generation_path = dir / "generation_config.json";
  if (fs::is_regular_file(generation_path, ec)) {
    const Value generation = read_json_object(generation_path);
    append_ids(generation.find("eos_token_id"), generation_path.string(), ckpt.eos_token_ids);
  }
  append_ids(raw.find("eos_token_id"), config_path.string(), ckpt.eos_token_ids);
  return ckpt;
}

}  // namespace ssd::model
