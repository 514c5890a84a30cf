// Reading safetensors files: [u64 little-endian N][N bytes of JSON header][data].
// The header is validated in full before any tensor is read, so a damaged
// file fails with its path and the entry at fault instead of reading garbage.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ssd::model::safetensors {

using Shape = std::vector<int64_t>;

/// "[2, 3]": a shape as error messages print it.
std::string shape_text(const Shape& shape);

/// One safetensors dtype: its name in headers, its size, and the ATen type a
/// weight of it converts from (Undefined: valid in the format, not a weight type).
struct Dtype {
  const char* name;
  uint64_t itemsize;
  at::ScalarType loadable;
};

struct TensorInfo {
  const Dtype* dtype = nullptr;
  Shape shape;
  uint64_t begin = 0, end = 0;  ///< relative to the start of the data section
};

struct File {
  std::filesystem::path path;
  uint64_t data_start = 0;
  std::map<std::string, TensorInfo> tensors;
};

/// Reads and validates the header of `path`. Throws std::invalid_argument
/// naming the file (and tensor) for a truncated or malformed file.
File read_header(const std::filesystem::path& path);

/// The JSON header's length, read from `prefix` (the file's first bytes, at
/// least 8 of them unless the file is shorter) and checked against
/// `file_size` and the 100 MB limit. Throws std::invalid_argument led by `where`.
uint64_t header_length(std::string_view prefix, uint64_t file_size, const std::string& where);

/// The checks read_header makes on the header text `header` of a file of
/// `file_size` bytes at `path`, without reading the file: the parse half of
/// read_header, bound for the fuzz tests (ssd._C.testing.parse_safetensors).
File parse_header(std::string_view header, uint64_t file_size, const std::filesystem::path& path);

/// Reads tensor `name` of `file` through `in` (an open stream of that file),
/// in the dtype stored; throws for a dtype that is not a float type.
at::Tensor read_tensor(const File& file, const std::string& name, const TensorInfo& info, std::ifstream& in);

}  // namespace ssd::model::safetensors
