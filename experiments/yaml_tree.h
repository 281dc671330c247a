// A YAML document as a plain, copyable tree that keeps every node's source position. yaml-cpp's
// nodes share state on copy and lose positions when cloned; sweep expansion needs both deep
// copies and positions, so the loader converts once into this form.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace twinstep::yaml {

// 0-based position as yaml-cpp reports it; printed 1-based. line < 0: unknown.
struct Mark {
  int32_t line = -1;
  int32_t column = -1;
};

// "source:line:column" (1-based), or just "source" when the mark is unknown.
std::string where(const std::string& source, Mark mark);

struct Entry;

struct Node {
  enum class Kind : uint8_t { kNull, kScalar, kSequence, kMapping };

  Kind kind = Kind::kNull;
  std::string scalar;   // kScalar: the value, quotes removed
  bool quoted = false;  // kScalar: written in quotes ('...' or "...")
  Mark mark;
  std::vector<Node> items;     // kSequence
  std::vector<Entry> entries;  // kMapping, in document order; keys are unique

  bool is_null() const { return kind == Kind::kNull; }
  bool is_scalar() const { return kind == Kind::kScalar; }
  bool is_sequence() const { return kind == Kind::kSequence; }
  bool is_mapping() const { return kind == Kind::kMapping; }

  // The entry with `key` in a mapping, or nullptr.
  const Entry* find(std::string_view key) const;
  Entry* find(std::string_view key);
};

struct Entry {
  std::string key;
  Mark key_mark;
  Node value;
};

// "a mapping", "a list", "null", "a string 'x'", "a number 12", "a boolean 'true'": how a value
// is named in type errors.
std::string describe(const Node& node);

// The value as written, in YAML flow style on one line: 8192, runahead, {preset: h200, ...}.
std::string to_flow(const Node& node);

// Parses `text` as exactly one YAML document whose mapping keys are scalars and unique.
// Throws ConfigError at the parser's mark for malformed YAML, at the second occurrence of a
// duplicate key, and at 1:1 for an empty document (no content, or only comments).
Node parse_document(const std::string& text, const std::string& source);

}  // namespace twinstep::yaml
