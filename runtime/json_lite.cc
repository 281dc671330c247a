#include "runtime/json_lite.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>

namespace twinstep {
namespace {

class Parser {
 public:
  Parser(std::string_view s, int max_depth) : s_(s), max_depth_(max_depth) {}

  JsonValue document() {
    skip_ws();
    JsonValue v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  // Where: line and column (1-based, in bytes) for a text a person edits, the byte offset too.
  [[noreturn]] void fail(const std::string& what) const {
    const std::string_view before = s_.substr(0, std::min(pos_, s_.size()));
    const size_t newline = before.rfind('\n');
    const size_t line = size_t(std::count(before.begin(), before.end(), '\n')) + 1;
    const size_t column =
        (newline == std::string_view::npos ? before.size() : before.size() - newline - 1) + 1;
    throw JsonError("JSON: " + what + " at line " + std::to_string(line) + ", column " +
                    std::to_string(column) + " (byte " + std::to_string(pos_) + ")");
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t'))
      ++pos_;
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  // What stands at pos_, for messages: "end of input (truncated?)" or the character.
  std::string found() const {
    if (pos_ >= s_.size()) return "end of input (truncated?)";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c < 0x20 || c >= 0x7f)
      return "byte 0x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    return std::string("'") + char(c) + "'";
  }
  void expect(char c) {
    if (peek() != c || pos_ >= s_.size())
      fail(std::string("expected '") + c + "', found " + found());
    ++pos_;
  }
  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  JsonValue value(int depth) {
    if (depth > max_depth_) fail("nesting deeper than " + std::to_string(max_depth_));
    JsonValue v;
    switch (peek()) {
      case '{':
        v.kind = JsonValue::Kind::kObject;
        object(v, depth);
        return v;
      case '[':
        v.kind = JsonValue::Kind::kArray;
        array(v, depth);
        return v;
      case '"':
        v.kind = JsonValue::Kind::kString;
        v.text = string();
        return v;
      case 't':
        literal("true");
        v.kind = JsonValue::Kind::kBool;
        v.boolean = true;
        return v;
      case 'f':
        literal("false");
        v.kind = JsonValue::Kind::kBool;
        return v;
      case 'n':
        literal("null");
        return v;
      default:
        if (peek() != '-' && (peek() < '0' || peek() > '9'))
          fail("expected a value, found " + found());
        v.kind = JsonValue::Kind::kNumber;
        v.text = number();
        return v;
    }
  }

  void object(JsonValue& v, int depth) {
    expect('{');
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key, found " + found());
      std::string key = string();
      for (const auto& [k, unused] : v.fields)
        if (k == key) fail("duplicate key \"" + key + "\"");
      skip_ws();
      expect(':');
      skip_ws();
      v.fields.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}');
      return;
    }
  }

  void array(JsonValue& v, int depth) {
    expect('[');
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect(']');
      return;
    }
  }

  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= uint32_t(c - 'A' + 10);
      else
        fail("invalid \\u escape");
    }
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate");
            pos_ += 2;
            const uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("invalid low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail("invalid escape");
      }
    }
  }

  std::string number() {
    const size_t begin = pos_;
    auto digits = [&] {
      const size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) fail("invalid number: expected a digit, found " + found());
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else {
      digits();
    }
    if (peek() == '.') {
      ++pos_;
      digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      digits();
    }
    if (pos_ - begin > 64) fail("number literal too long");
    return std::string(s_.substr(begin, pos_ - begin));
  }

  std::string_view s_;
  size_t pos_ = 0;
  int max_depth_;
};

}  // namespace

const char* json_kind_name(JsonValue::Kind k) {
  switch (k) {
    case JsonValue::Kind::kNull:
      return "null";
    case JsonValue::Kind::kBool:
      return "boolean";
    case JsonValue::Kind::kNumber:
      return "number";
    case JsonValue::Kind::kString:
      return "string";
    case JsonValue::Kind::kArray:
      return "array";
    case JsonValue::Kind::kObject:
      return "object";
  }
  return "?";
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind != Kind::kObject) return nullptr;
  for (const auto& [k, v] : fields)
    if (k == key) return &v;
  return nullptr;
}

bool JsonValue::is_integer() const {
  return kind == Kind::kNumber && text.find_first_of(".eE") == std::string::npos;
}

uint64_t JsonValue::as_u64(const std::string& what) const {
  if (!is_integer() || text[0] == '-')
    throw JsonError(what + ": expected a non-negative integer, got " +
                    (kind == Kind::kNumber ? text : json_kind_name(kind)));
  uint64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw JsonError(what + ": integer " + text + " does not fit in 64 bits");
  return v;
}

int64_t JsonValue::as_i64(const std::string& what) const {
  if (!is_integer())
    throw JsonError(what + ": expected an integer, got " +
                    (kind == Kind::kNumber ? text : json_kind_name(kind)));
  int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw JsonError(what + ": integer " + text + " does not fit in 64 bits");
  return v;
}

double JsonValue::as_double(const std::string& what) const {
  if (kind != Kind::kNumber)
    throw JsonError(what + ": expected a number, got " + json_kind_name(kind));
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE)
    throw JsonError(what + ": number " + text + " is out of range");
  return v;
}

const std::string& JsonValue::as_string(const std::string& what) const {
  if (kind != Kind::kString)
    throw JsonError(what + ": expected a string, got " + json_kind_name(kind));
  return text;
}

JsonValue parse_json(std::string_view text, int max_depth) {
  return Parser(text, max_depth).document();
}

}  // namespace twinstep
