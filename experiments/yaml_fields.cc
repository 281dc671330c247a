#include "experiments/yaml_fields.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "policies/error.h"

namespace twinstep::yaml {
namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The scalar text of a plain scalar; type errors name `expected`.
const std::string& plain_scalar(const Context& ctx, const Node& node, const std::string& field,
                                const std::string& expected) {
  if (!node.is_scalar() || node.quoted) {
    ctx.fail(node.mark, field + " must be " + expected + ", got " + describe(node));
  }
  return node.scalar;
}

bool parse_double(const std::string& text, double* value) {
  if (text.empty()) return false;
  char c = text[0];
  if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+' || c == '.')) {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  *value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(*value) && errno != ERANGE;
}

std::string format_double(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

}  // namespace

void Context::fail(Mark mark, const std::string& message) const {
  throw ConfigError(where(source, mark), message + note);
}

std::string join(const std::string& parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return parent + "." + std::string(key);
}

std::string join_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  return out;
}

std::string did_you_mean(std::string_view name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = 3;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(name, c);
    // Two edits at most, and at most a third of the longer name ('a100' is not 'h200').
    if (d < best_distance && 3 * d <= std::max(name.size(), c.size())) {
      best_distance = d;
      best = c;
    }
  }
  return best.empty() ? "" : "; did you mean '" + best + "'?";
}

MapReader::MapReader(const Context& ctx, const Node& node, std::string path,
                     std::vector<std::string> allowed)
    : ctx_(ctx), node_(node), path_(std::move(path)) {
  std::string name = path_.empty() ? "the experiment" : path_;
  if (!node.is_mapping()) {
    ctx.fail(node.mark, name + " must be a mapping (key: value lines), got " + describe(node));
  }
  for (const Entry& e : node.entries) {
    if (std::find(allowed.begin(), allowed.end(), e.key) != allowed.end()) continue;
    std::string message = "unknown key '" + e.key + "'";
    message += path_.empty() ? " at the top level" : " in " + path_;
    message += "; allowed: " + join_list(allowed) + did_you_mean(e.key, allowed);
    ctx.fail(e.key_mark, message);
  }
}

const Node* MapReader::get(std::string_view key) const {
  const Entry* e = node_.find(key);
  return e == nullptr ? nullptr : &e->value;
}

const Node& MapReader::require(std::string_view key, std::string_view hint) const {
  const Node* value = get(key);
  if (value == nullptr) {
    std::string message = "missing required key '" + std::string(key) + "'";
    if (!path_.empty()) message += " in " + path_;
    if (!hint.empty()) message += " (" + std::string(hint) + ")";
    ctx_.fail(node_.mark, message);
  }
  return *value;
}

Mark MapReader::key_mark(std::string_view key) const {
  const Entry* e = node_.find(key);
  return e == nullptr ? node_.mark : e->key_mark;
}

int64_t read_int(const Context& ctx, const Node& node, const std::string& field, int64_t lo,
                 int64_t hi) {
  const std::string range = " (" + std::to_string(lo) + " to " + std::to_string(hi) + ")";
  const std::string& text = plain_scalar(ctx, node, field, "an integer" + range);
  int64_t value = 0;
  const char* begin = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range) {
    ctx.fail(node.mark, field + " = " + text + " is out of range" + range);
  }
  if (ec != std::errc() || ptr != end) {
    ctx.fail(node.mark, field + " must be an integer" + range + ", got " + describe(node));
  }
  if (value < lo || value > hi) {
    ctx.fail(node.mark, field + " = " + text + " is out of range" + range);
  }
  return value;
}

uint64_t read_uint64(const Context& ctx, const Node& node, const std::string& field) {
  const std::string range = " (0 to " + std::to_string(std::numeric_limits<uint64_t>::max()) + ")";
  const std::string& text = plain_scalar(ctx, node, field, "an integer" + range);
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) {
    ctx.fail(node.mark, field + " = " + text + " is out of range" + range);
  }
  if (ec != std::errc() || ptr != end) {
    ctx.fail(node.mark, field + " must be an integer" + range + ", got " + describe(node));
  }
  return value;
}

double read_double(const Context& ctx, const Node& node, const std::string& field, double lo,
                   double hi, bool lo_exclusive) {
  const std::string range = lo_exclusive
                                ? " (> " + format_double(lo) + " and <= " + format_double(hi) + ")"
                                : " (" + format_double(lo) + " to " + format_double(hi) + ")";
  const std::string& text = plain_scalar(ctx, node, field, "a number" + range);
  double value = 0;
  if (!parse_double(text, &value)) {
    ctx.fail(node.mark, field + " must be a finite number" + range + ", got " + describe(node));
  }
  if (value < lo || value > hi || (lo_exclusive && value == lo)) {
    ctx.fail(node.mark, field + " = " + text + " is out of range" + range);
  }
  return value;
}

bool read_bool(const Context& ctx, const Node& node, const std::string& field) {
  const std::string& text = plain_scalar(ctx, node, field, "true or false");
  if (text == "true") return true;
  if (text == "false") return false;
  ctx.fail(node.mark, field + " must be true or false, got " + describe(node));
}

std::string read_string(const Context& ctx, const Node& node, const std::string& field) {
  if (!node.is_scalar()) ctx.fail(node.mark, field + " must be a string, got " + describe(node));
  return node.scalar;
}

int64_t read_duration_ns(const Context& ctx, const Node& node, const std::string& field,
                         bool bare_is_ns) {
  static const std::vector<std::pair<std::string, double>> kUnits = {
      {"ns", 1.0}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}};
  const std::string expected =
      "a duration with a unit (e.g. 120us; units: ns, us, ms, s)" +
      std::string(bare_is_ns ? " or an integer number of nanoseconds" : "");
  if (!node.is_scalar()) {
    ctx.fail(node.mark, field + " must be " + expected + ", got " + describe(node));
  }
  const std::string& text = node.scalar;
  size_t unit_start = text.size();
  while (unit_start > 0 && std::isalpha(static_cast<unsigned char>(text[unit_start - 1]))) {
    --unit_start;
  }
  std::string number = text.substr(0, unit_start);
  while (!number.empty() && number.back() == ' ') number.pop_back();
  const std::string unit = text.substr(unit_start);
  double magnitude = 0;
  if (!parse_double(number, &magnitude)) {
    ctx.fail(node.mark, field + " must be " + expected + ", got " + describe(node));
  }
  double scale = 0;
  if (unit.empty()) {
    if (!bare_is_ns) {
      ctx.fail(node.mark, field + " = " + text + " has no unit; write e.g. " + text +
                              "us (units: ns, us, ms, s)");
    }
    int64_t ns = read_int(ctx, node, field, 0, kMaxDurationNs);
    return ns;
  }
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) scale = factor;
  }
  if (scale == 0) {
    ctx.fail(node.mark,
             field + " has unknown duration unit '" + unit + "'; allowed: ns, us, ms, s");
  }
  if (magnitude < 0) ctx.fail(node.mark, field + " = " + text + " must not be negative");
  double ns = magnitude * scale;
  if (ns > static_cast<double>(kMaxDurationNs)) {
    ctx.fail(node.mark, field + " = " + text + " is longer than the limit of 3600s");
  }
  return std::llround(ns);
}

}  // namespace twinstep::yaml
