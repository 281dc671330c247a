// Typed, range-checked reads from a yaml::Node. Every failure throws ConfigError at the node's
// position with a message naming the field (as a dotted path, e.g. workload.requests), what was
// expected, and the allowed values or range.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "experiments/yaml_tree.h"

namespace twinstep::yaml {

// Where values come from: the source name for positions and a note appended to every message
// (e.g. " (in sweep variant 3: workload.concurrency=4)"), empty for none.
struct Context {
  std::string source;
  std::string note;

  [[noreturn]] void fail(Mark mark, const std::string& message) const;
};

// Joins a dotted field path: join("workload", "requests") == "workload.requests".
std::string join(const std::string& parent, std::string_view key);

// "a, b, c".
std::string join_list(const std::vector<std::string>& names);
// "; did you mean 'X'?" for the closest candidate (the first of equals) within two edits of
// `name` and at most a third of the longer one's length, else "": appended to the unknown-name
// errors.
std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates);

// A mapping whose keys have been checked against an allowed set. `path` names the mapping in
// messages ("" for the top level).
class MapReader {
 public:
  // Throws unless `node` is a mapping whose keys are all in `allowed`.
  MapReader(const Context& ctx, const Node& node, std::string path,
            std::vector<std::string> allowed);

  const Node* get(std::string_view key) const;
  // Throws "missing required key" at the mapping's position when absent; `hint` follows.
  const Node& require(std::string_view key, std::string_view hint = {}) const;
  Mark key_mark(std::string_view key) const;
  bool has(std::string_view key) const { return get(key) != nullptr; }
  // The dotted path of a child key.
  std::string field(std::string_view key) const { return join(path_, key); }
  const Node& node() const { return node_; }
  const Context& ctx() const { return ctx_; }

 private:
  const Context& ctx_;
  const Node& node_;
  std::string path_;
};

// A plain (unquoted) integer in [lo, hi]; floats, booleans, quoted strings are errors.
int64_t read_int(const Context& ctx, const Node& node, const std::string& field, int64_t lo,
                 int64_t hi);
uint64_t read_uint64(const Context& ctx, const Node& node, const std::string& field);
// A finite plain number in [lo, hi] (or (lo, hi] when lo_exclusive); integers are accepted.
double read_double(const Context& ctx, const Node& node, const std::string& field, double lo,
                   double hi, bool lo_exclusive);
// true or false.
bool read_bool(const Context& ctx, const Node& node, const std::string& field);
// Any scalar (quoted or not).
std::string read_string(const Context& ctx, const Node& node, const std::string& field);

// The longest duration accepted anywhere: one hour.
constexpr int64_t kMaxDurationNs = 3'600'000'000'000;

// A non-negative duration with a unit: 120us, 1.5ms, 0ns (units ns, us, ms, s), rounded to whole
// nanoseconds, at most kMaxDurationNs. With `bare_is_ns`, a plain integer means nanoseconds
// (for fields whose names end in _ns).
int64_t read_duration_ns(const Context& ctx, const Node& node, const std::string& field,
                         bool bare_is_ns = false);

// One of a fixed set of names; the error lists them.
template <typename E>
E read_enum(const Context& ctx, const Node& node, const std::string& field,
            const std::vector<std::pair<std::string, E>>& choices) {
  std::string name = read_string(ctx, node, field);
  std::vector<std::string> names;
  for (const auto& [choice, value] : choices) {
    if (choice == name) return value;
    names.push_back(choice);
  }
  ctx.fail(node.mark, "unknown " + field + " '" + name + "'; allowed: " + join_list(names) +
                          did_you_mean(name, names));
}

}  // namespace twinstep::yaml
