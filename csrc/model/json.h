// A small, strict JSON reader for checkpoint metadata (config.json,
// safetensors headers, shard indexes). RFC 8259 only: no comments, trailing
// commas, NaN or duplicate object keys.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ssd::model::json {

/// One JSON value. Numbers written without '.', 'e' or 'E' are integers
/// (like Python's json module); all others are doubles.
class Value {
 public:
  using Array = std::vector<Value>;
  using Object = std::map<std::string, Value, std::less<>>;

  Value() = default;  // null
  explicit Value(bool b) : data_(b) {}
  explicit Value(int64_t i) : data_(i) {}
  explicit Value(double d) : data_(d) {}
  explicit Value(std::string s) : data_(std::move(s)) {}
  explicit Value(Array a) : data_(std::move(a)) {}
  explicit Value(Object o) : data_(std::move(o)) {}

  bool is_null() const { return std::holds_alternative<std::monostate>(data_); }
  bool is_bool() const { return std::holds_alternative<bool>(data_); }
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }
  bool is_number() const { return is_int() || std::holds_alternative<double>(data_); }
  bool is_string() const { return std::holds_alternative<std::string>(data_); }
  bool is_array() const { return std::holds_alternative<Array>(data_); }
  bool is_object() const { return std::holds_alternative<Object>(data_); }

  /// Accessors throw std::invalid_argument when the value has another type.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  ///< integers convert
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;

  /// The member `key` of an object, or nullptr when absent (or not an object).
  const Value* find(std::string_view key) const;
  /// Python's truthiness: null, false, 0, "", [] and {} are false.
  bool truthy() const;
  /// "null", "bool", "int", "float", "string", "array" or "object".
  const char* type_name() const;
  /// Compact JSON text of the value, for error messages.
  std::string dump() const;

 private:
  template <typename T>
  const T& get(const char* wanted) const;

  std::variant<std::monostate, bool, int64_t, double, std::string, Array, Object> data_;
};

/// Parses one JSON document (surrounding whitespace allowed). Throws
/// std::invalid_argument("... at byte N") on malformed input.
Value parse(std::string_view text);

/// parse(text) for the contents of `source` (a file name), which leads any
/// error: "cannot read SOURCE: malformed JSON: ... at byte N".
Value parse(std::string_view text, const std::string& source);

}  // namespace ssd::model::json
