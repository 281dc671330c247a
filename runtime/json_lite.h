// A small strict JSON reader for checkpoint metadata (config.json, safetensors headers, shard
// indexes). Input is untrusted (a fuzz target): nesting depth, string and document sizes are
// bounded, duplicate object keys are errors, numbers keep their source text so 64-bit offsets
// convert exactly. Errors are JsonError with a byte offset.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace twinstep {

class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JsonField;

struct JsonValue {
  enum class Kind : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;               // kString: the decoded string; kNumber: the literal as written
  std::vector<JsonValue> items;   // kArray
  std::vector<JsonField> fields;  // kObject, in source order

  // nullptr when absent or not an object.
  const JsonValue* find(std::string_view key) const;
  bool is_integer() const;  // a number literal without fraction or exponent
  // Exact conversions; throw JsonError naming `what` when the value does not fit.
  uint64_t as_u64(const std::string& what) const;
  int64_t as_i64(const std::string& what) const;
  double as_double(const std::string& what) const;
  const std::string& as_string(const std::string& what) const;
};

// Parses one JSON document (surrounding whitespace allowed, nothing else after it).
// An object member. Defined after JsonValue (std::vector allows the incomplete element type
// above; std::pair would not, under clang); first/second keep pair-like access.
struct JsonField {
  JsonField(std::string key, JsonValue value) : first(std::move(key)), second(std::move(value)) {}
  std::string first;
  JsonValue second;
};

JsonValue parse_json(std::string_view text, int max_depth = 64);

const char* json_kind_name(JsonValue::Kind k);

}  // namespace twinstep
