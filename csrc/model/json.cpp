#include "json.h"

#include <charconv>
#include <cstdio>
#include <stdexcept>

namespace ssd::model::json {

namespace {

// Deep enough for any real config; bounds the recursion on hostile input.
constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Value document() {
    skip_space();
    Value v = value(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected trailing content");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("malformed JSON: " + what + " at byte " + std::to_string(pos_));
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r')) ++pos_;
  }

  void expect(char c, const char* context) {
    if (peek() != c) fail(std::string("expected '") + c + "' " + context);
    ++pos_;
  }

  Value value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    switch (peek()) {
      case '{': return object(depth);
      case '[': return array(depth);
      case '"': return Value(string());
      case 't': literal("true"); return Value(true);
      case 'f': literal("false"); return Value(false);
      case 'n': literal("null"); return Value();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return number();
        fail(at_end() ? "unexpected end of input" : "unexpected character");
    }
  }

  void literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  Value object(int depth) {
    ++pos_;  // '{'
    Value::Object members;
    skip_space();
    if (peek() == '}') {
      ++pos_;
      return Value(std::move(members));
    }
    for (;;) {
      skip_space();
      const size_t key_pos = pos_;
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      skip_space();
      expect(':', "after an object key");
      skip_space();
      Value v = value(depth + 1);
      if (!members.emplace(std::move(key), std::move(v)).second) {
        pos_ = key_pos;
        fail("duplicate object key");
      }
      skip_space();
      if (peek() == '}') break;
      expect(',', "or '}' in an object");
    }
    ++pos_;
    return Value(std::move(members));
  }

  Value array(int depth) {
    ++pos_;  // '['
    Value::Array items;
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return Value(std::move(items));
    }
    for (;;) {
      skip_space();
      items.push_back(value(depth + 1));
      skip_space();
      if (peek() == ']') break;
      expect(',', "or ']' in an array");
    }
    ++pos_;
    return Value(std::move(items));
  }

  size_t digits() {
    const size_t start = pos_;
    while (peek() >= '0' && peek() <= '9') ++pos_;
    return pos_ - start;
  }

  Value number() {
    const size_t start = pos_;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
      if (peek() >= '0' && peek() <= '9') fail("leading zero in a number");
    } else if (digits() == 0) {
      fail("expected a digit");
    }
    bool integral = true;
    if (peek() == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail("expected a digit after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      integral = false;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("expected a digit in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t i = 0;
      if (std::from_chars(first, last, i).ec == std::errc()) return Value(i);
      // An integer beyond int64 is kept as a double rather than rejected.
    }
    double d = 0;
    if (std::from_chars(first, last, d).ec != std::errc()) {
      pos_ = start;
      fail("number out of range");
    }
    return Value(d);
  }

  unsigned hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++pos_) {
      const char c = peek();
      code <<= 4;
      if (c >= '0' && c <= '9') code |= c - '0';
      else if (c >= 'a' && c <= 'f') code |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') code |= c - 'A' + 10;
      else fail("expected 4 hex digits after \\u");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // After "\\u"; a surrogate pair spans two escapes. Errors point at the escape.
  unsigned escaped_code_point() {
    const size_t start = pos_ - 2;
    unsigned cp = hex4();
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      const bool paired = cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u";
      const unsigned low = paired ? (pos_ += 2, hex4()) : 0;
      if (low < 0xDC00 || low > 0xDFFF) {
        pos_ = start;
        fail("unpaired UTF-16 surrogate in a \\u escape");
      }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    return cp;
  }

  // Copies one raw UTF-8 sequence, rejecting overlong forms, surrogates and
  // code points above U+10FFFF.
  void raw_utf8(std::string& out) {
    const auto lead = static_cast<unsigned char>(peek());
    int extra = 0;
    unsigned cp = 0, min = 0;
    if (lead >= 0xC2 && lead <= 0xDF) extra = 1, cp = lead & 0x1F, min = 0x80;
    else if (lead >= 0xE0 && lead <= 0xEF) extra = 2, cp = lead & 0x0F, min = 0x800;
    else if (lead >= 0xF0 && lead <= 0xF4) extra = 3, cp = lead & 0x07, min = 0x10000;
    else fail("invalid UTF-8");
    for (int i = 1; i <= extra; ++i) {
      const auto c = static_cast<unsigned char>(pos_ + i < text_.size() ? text_[pos_ + i] : 0);
      if ((c & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8");
    out.append(text_.substr(pos_, extra + 1));
    pos_ += extra + 1;
  }

  std::string string() {
    ++pos_;  // '"'
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = peek();
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail("unescaped control character in a string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        raw_utf8(out);
        continue;
      }
      ++pos_;
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': append_utf8(out, escaped_code_point()); break;
        default: --pos_; fail("invalid escape sequence");
      }
    }
    ++pos_;
    return out;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

void quote(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

void dump_to(std::string& out, const Value& v) {
  if (v.is_null()) out += "null";
  else if (v.is_bool()) out += v.as_bool() ? "true" : "false";
  else if (v.is_int()) out += std::to_string(v.as_int());
  else if (v.is_number()) {
    char buf[32];  // shortest text that reads back as the same double
    out.append(buf, std::to_chars(buf, buf + sizeof buf, v.as_double()).ptr);
  } else if (v.is_string()) {
    quote(out, v.as_string());
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.as_array().size(); ++i) {
      if (i) out += ", ";
      dump_to(out, v.as_array()[i]);
    }
    out += ']';
  } else {
    out += '{';
    bool first = true;
    for (const auto& [key, member] : v.as_object()) {
      if (!first) out += ", ";
      first = false;
      quote(out, key);
      out += ": ";
      dump_to(out, member);
    }
    out += '}';
  }
}

}  // namespace

template <typename T>
const T& Value::get(const char* wanted) const {
  if (const T* p = std::get_if<T>(&data_)) return *p;
  throw std::invalid_argument(std::string("expected a JSON ") + wanted + ", got " + type_name() + " " + dump());
}

bool Value::as_bool() const { return get<bool>("bool"); }
int64_t Value::as_int() const { return get<int64_t>("integer"); }
const std::string& Value::as_string() const { return get<std::string>("string"); }
const Value::Array& Value::as_array() const { return get<Array>("array"); }
const Value::Object& Value::as_object() const { return get<Object>("object"); }

double Value::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(data_));
  return get<double>("number");
}

const Value* Value::find(std::string_view key) const {
  const auto* members = std::get_if<Object>(&data_);
  if (!members) return nullptr;
  auto it = members->find(key);
  return it == members->end() ? nullptr : &it->second;
}

bool Value::truthy() const {
  switch (data_.index()) {
    case 0: return false;
    case 1: return std::get<bool>(data_);
    case 2: return std::get<int64_t>(data_) != 0;
    case 3: return std::get<double>(data_) != 0.0;
    case 4: return !std::get<std::string>(data_).empty();
    case 5: return !std::get<Array>(data_).empty();
    default: return !std::get<Object>(data_).empty();
  }
}

const char* Value::type_name() const {
  static const char* const kNames[] = {"null", "bool", "int", "float", "string", "array", "object"};
  return kNames[data_.index()];
}

std::string Value::dump() const {
  std::string out;
  dump_to(out, *this);
  return out;
}

Value parse(std::string_view text) { return Parser(text).document(); }

Value parse(std::string_view text, const std::string& source) {
  try {
    return parse(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument("cannot read " + source + ": " + e.what());
  }
}

}  // namespace ssd::model::json
