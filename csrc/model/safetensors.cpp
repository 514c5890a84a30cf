#include "safetensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <stdexcept>

#include "json.h"

namespace ssd::model::safetensors {

namespace fs = std::filesystem;
using json::Value;

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the limit the safetensors library enforces

// Valid in safetensors, but not a weight dtype the loader converts.
constexpr at::ScalarType kNotLoadable = at::ScalarType::Undefined;

constexpr Dtype kDtypes[] = {
    {"F32", 4, at::kFloat},        {"F16", 2, at::kHalf},         {"BF16", 2, at::kBFloat16},
    {"F64", 8, at::kDouble},       {"BOOL", 1, kNotLoadable},     {"U8", 1, kNotLoadable},
    {"I8", 1, kNotLoadable},       {"F8_E4M3", 1, kNotLoadable},  {"F8_E5M2", 1, kNotLoadable},
    {"I16", 2, kNotLoadable},      {"U16", 2, kNotLoadable},      {"I32", 4, kNotLoadable},
    {"U32", 4, kNotLoadable},      {"I64", 8, kNotLoadable},      {"U64", 8, kNotLoadable},
};

[[noreturn]] void fail(const std::string& message) { throw std::invalid_argument(message); }

const Value& field(const Value& entry, const char* key, const std::string& context) {
  const Value* v = entry.find(key);
  if (!v) fail(context + ": entry has no '" + key + "'");
  return *v;
}

const Dtype& dtype_of(const Value& entry, const std::string& context) {
  const Value& dtype = field(entry, "dtype", context);
  for (const Dtype& d : kDtypes)
    if (dtype.is_string() && dtype.as_string() == d.name) return d;
  fail(context + ": unknown dtype " + dtype.dump());
}

// The shape, checked against overflow of its byte size (itemsize * every dim).
Shape shape_of(const Value& entry, uint64_t itemsize, uint64_t& bytes, const std::string& context) {
  const Value& shape = field(entry, "shape", context);
  auto bad_shape = [&] { fail(context + ": 'shape' must be a list of non-negative integers, got " + shape.dump()); };
  if (!shape.is_array()) bad_shape();
  Shape out;
  bytes = itemsize;
  for (const Value& dim : shape.as_array()) {
    if (!dim.is_int() || dim.as_int() < 0) bad_shape();
    const auto n = static_cast<uint64_t>(dim.as_int());
    if (n > 0 && bytes > std::numeric_limits<uint64_t>::max() / n) fail(context + ": shape is too large");
    bytes *= n;
    out.push_back(dim.as_int());
  }
  return out;
}

TensorInfo tensor_info(const Value& entry, uint64_t data_size, const std::string& context) {
  if (!entry.is_object()) fail(context + ": entry must be an object, got " + entry.dump());
  TensorInfo info;
  info.dtype = &dtype_of(entry, context);
  uint64_t bytes = 0;
  info.shape = shape_of(entry, info.dtype->itemsize, bytes, context);

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

// The JSON header's bytes, after checking the length prefix against the file size.
std::string header_text(const fs::path& path, uint64_t& file_size) {
  const std::string where = path.string();
  std::error_code ec;
  file_size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) fail("cannot read safetensors file " + where + (ec ? ": " + ec.message() : ""));
  char prefix[8] = {};
  in.read(prefix, static_cast<std::streamsize>(std::min<uint64_t>(file_size, 8)));
  const uint64_t n = header_length(std::string_view(prefix, std::min<uint64_t>(file_size, 8)), file_size, where);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  if (!in) fail("cannot read safetensors file " + where);
  return header;
}

}  // namespace

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t header_length(std::string_view prefix, uint64_t file_size, const std::string& where) {
  if (file_size < 8 || prefix.size() < 8)
    fail(where + ": truncated safetensors file (" + std::to_string(file_size) +
         " bytes, less than the 8-byte header length)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(prefix[i]);
  if (n > kMaxHeaderBytes)
    fail(where + ": safetensors header length " + std::to_string(n) + " exceeds the 100 MB limit (corrupt file?)");
  if (n > file_size - 8)
    fail(where + ": truncated safetensors file: the header needs " + std::to_string(n) + " bytes, but only " +
         std::to_string(file_size - 8) + " follow the length");
  return n;
}

File parse_header(std::string_view header, uint64_t file_size, const fs::path& path) {
  const std::string where = path.string();
  const uint64_t data_start = 8 + header.size();
  if (data_start > file_size) fail(where + ": truncated safetensors file (the header runs past its end)");
  const Value root = json::parse(header, where + " (safetensors header)");
  if (!root.is_object()) fail(where + ": safetensors header is not a JSON object");
  File file{path, data_start, {}};
  for (const auto& [name, entry] : root.as_object()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(where + ": '__metadata__' must be an object of strings");
      for (const auto& [key, value] : entry.as_object())
        if (!value.is_string()) fail(where + ": '__metadata__' value of '" + key + "' is not a string");
      continue;
    }
    file.tensors.emplace(name, tensor_info(entry, file_size - data_start, where + ": tensor " + name));
  }
  return file;
}

File read_header(const fs::path& path) {
  uint64_t size = 0;
  const std::string header = header_text(path, size);
  return parse_header(header, size, path);
}

at::Tensor read_tensor(const File& file, const std::string& name, const TensorInfo& info, std::ifstream& in) {
  const std::string where = file.path.string() + ": tensor " + name;
  if (info.dtype->loadable == kNotLoadable)
    fail(where + " has dtype " + info.dtype->name + " (supported: F32, F16, BF16, F64)");
  at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(info.dtype->loadable));
  in.seekg(static_cast<std::streamoff>(file.data_start + info.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(info.end - info.begin));
  if (!in) fail("cannot read " + where + " (file unreadable or changed while loading)");
  return t;
}

}  // namespace ssd::model::safetensors
