#include "policies/calibration_profile.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "policies/error.h"
#include "policies/step_kernels.h"

#ifndef TWINSTEP_DEFAULT_PROFILE_DIR
#define TWINSTEP_DEFAULT_PROFILE_DIR "results/profiles"
#endif

namespace twinstep {
namespace {

constexpr int kFormat = 1;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "(none)" : s;
}

// ---- writing ----------------------------------------------------------------------------------

std::string num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A YAML double-quoted scalar: escapes backslash, quote and control characters.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

// The measured figures a profile may set, by their HardwareSpec field names.
struct Figure {
  const char* name;
  int64_t HardwareSpec::*i64;
  double HardwareSpec::*number;
  bool positive;  // > 0 (a rate), else >= 0
};
constexpr Figure kFigures[] = {
    {"stream_read_tbps", nullptr, &HardwareSpec::stream_read_tbps, true},
    {"kernel_floor_ns", &HardwareSpec::kernel_floor_ns, nullptr, false},
    {"eager_launch_ns", &HardwareSpec::eager_launch_ns, nullptr, false},
    {"graph_launch_ns", &HardwareSpec::graph_launch_ns, nullptr, false},
    {"graph_node_gap_ns", &HardwareSpec::graph_node_gap_ns, nullptr, false},
    {"pdl_node_gap_ns", &HardwareSpec::pdl_node_gap_ns, nullptr, false},
    {"eager_node_gap_ns", &HardwareSpec::eager_node_gap_ns, nullptr, false},
    {"d2h_latency_ns", &HardwareSpec::d2h_latency_ns, nullptr, false},
    {"d2h_gbps", nullptr, &HardwareSpec::d2h_gbps, true},
    {"host_wake_ns", &HardwareSpec::host_wake_ns, nullptr, false},
    // Collectives (`twinstep calibrate-nccl`): alpha + algorithm bytes / interconnect_gbps.
    {"interconnect_gbps", nullptr, &HardwareSpec::interconnect_gbps, true},
    {"allreduce_alpha_ns", &HardwareSpec::allreduce_alpha_ns, nullptr, false},
    {"alltoall_alpha_ns", &HardwareSpec::alltoall_alpha_ns, nullptr, false},
    {"p2p_alpha_ns", &HardwareSpec::p2p_alpha_ns, nullptr, false},
};

// Figures written only where they differ from the preset's default (profiles written before them
// lack them and read as the default): the rows the kernel fits hold for and the prefill rates
// (HardwareSpec, "Beyond the calibrated range"; 0: not measured).
struct OptionalFigure {
  const char* name;
  int32_t HardwareSpec::*i32;
  double HardwareSpec::*number;
};
constexpr OptionalFigure kOptionalFigures[] = {
    {"kernel_fit_max_rows", &HardwareSpec::kernel_fit_max_rows, nullptr},
    {"prefill_gemm_tflops", nullptr, &HardwareSpec::prefill_gemm_tflops},
    {"prefill_moe_tflops", nullptr, &HardwareSpec::prefill_moe_tflops},
    {"prefill_attention_tbps", nullptr, &HardwareSpec::prefill_attention_tbps},
};

// ---- reading ----------------------------------------------------------------------------------

class Reader {
 public:
  static constexpr size_t kMaxKeyBytes = 256;  // of a mapping key (see mapping())

  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& msg) const {
    if (m.line < 0) throw ConfigError(source_, msg);
    throw ConfigError(
        source_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1), msg);
  }

  // The mapping's entries, checking that keys are known and unique.
  std::vector<std::pair<std::string, YAML::Node>> mapping(const YAML::Node& n,
                                                          const std::string& what,
                                                          const std::vector<std::string>& allowed) {
    if (!n.IsMap()) fail(n.Mark(), what + " must be a mapping");
    std::vector<std::pair<std::string, YAML::Node>> out;
    for (auto it = n.begin(); it != n.end(); ++it) {
      if (!it->first.IsScalar()) fail(it->first.Mark(), what + ": keys must be plain names");
      const std::string key = it->first.Scalar();
      // Keys are names (kernels, models, measurements): printable and short, so that the
      // writer's quoted form stays a legal YAML implicit key (at most 1024 characters).
      if (key.size() > kMaxKeyBytes || std::any_of(key.begin(), key.end(), [](unsigned char c) {
            return c < 0x20 || c == 0x7f;
          })) {
        fail(it->first.Mark(), what + ": a key must be at most " + std::to_string(kMaxKeyBytes) +
                                   " printable characters");
      }
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        fail(it->first.Mark(),
             "unknown field '" + key + "' in " + what + "; known: " + join(allowed));
      }
      for (const auto& [k, v] : out) {
        if (k == key) fail(it->first.Mark(), "duplicate field '" + key + "' in " + what);
      }
      out.emplace_back(key, it->second);
    }
    return out;
  }

  static const YAML::Node* find(const std::vector<std::pair<std::string, YAML::Node>>& m,
                                const std::string& key) {
    for (const auto& [k, v] : m) {
      if (k == key) return &v;
    }
    return nullptr;
  }

  const YAML::Node& require(const std::vector<std::pair<std::string, YAML::Node>>& m,
                            const YAML::Node& parent, const std::string& key,
                            const std::string& what) const {
    const YAML::Node* n = find(m, key);
    if (n == nullptr) fail(parent.Mark(), what + " is missing required field '" + key + "'");
    return *n;
  }

  std::string text(const YAML::Node& n, const std::string& field) const {
    if (!n.IsScalar()) fail(n.Mark(), field + " must be text");
    return n.Scalar();
  }

  double number(const YAML::Node& n, const std::string& field, double lo, bool lo_exclusive,
                double hi = std::numeric_limits<double>::max()) const {
    if (!n.IsScalar()) fail(n.Mark(), field + " must be a number");
    const std::string& s = n.Scalar();
    double v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v)) {
      fail(n.Mark(), field + " must be a finite number, got '" + s + "'");
    }
    if (v < lo || (lo_exclusive && v == lo) || v > hi) {
      fail(n.Mark(), field + " = " + s + " is out of range " + (lo_exclusive ? "(" : "[") +
                         num(lo) + ", " + num(hi) + "]");
    }
    return v;
  }

  int64_t integer(const YAML::Node& n, const std::string& field, int64_t lo, int64_t hi) const {
    if (!n.IsScalar()) fail(n.Mark(), field + " must be an integer");
    const std::string& s = n.Scalar();
    int64_t v = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) {
      fail(n.Mark(), field + " must be an integer, got '" + s + "'");
    }
    if (v < lo || v > hi) {
      fail(n.Mark(), field + " = " + s + " is out of range [" + std::to_string(lo) + ", " +
                         std::to_string(hi) + "]");
    }
    return v;
  }

 private:
  std::string source_;
};

std::vector<std::string> kernel_class_names() {
  std::vector<std::string> v;
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    if (KernelClass(c) != KernelClass::kCollective) v.push_back(kernel_class_name(KernelClass(c)));
  }
  return v;
}

Distribution read_distribution(Reader& r, const YAML::Node& n, const std::string& what) {
  const auto m = r.mapping(n, what, {"n", "mean_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns"});
  Distribution d;
  d.n = r.integer(r.require(m, n, "n", what), what + ".n", 0, int64_t(1) << 50);
  d.mean_ns = r.number(r.require(m, n, "mean_ns", what), what + ".mean_ns", 0, false);
  d.p50_ns = r.number(r.require(m, n, "p50_ns", what), what + ".p50_ns", 0, false);
  d.p90_ns = r.number(r.require(m, n, "p90_ns", what), what + ".p90_ns", 0, false);
  d.p99_ns = r.number(r.require(m, n, "p99_ns", what), what + ".p99_ns", 0, false);
  d.max_ns = r.number(r.require(m, n, "max_ns", what), what + ".max_ns", 0, false);
  return d;
}

// One fit: {base_ns, ns_per_byte, ns_per_flop, r2, max_rel_err, samples[, split_intensity,
// wide_*]} (kernels.<class> and kernel_names.<name>).
KernelFit read_fit(Reader& r, const YAML::Node& node, const std::string& what) {
  const auto m =
      r.mapping(node, what,
                {"base_ns", "ns_per_byte", "ns_per_flop", "ns_per_request", "ns_per_split_row",
                 "r2", "max_rel_err", "samples", "split_intensity", "split_bytes", "wide_base_ns",
                 "wide_ns_per_byte", "wide_ns_per_flop", "wide_ns_per_request"});
  // Optional coefficients (absent: 0), so profiles written before them still load.
  auto optional = [&](const char* field, double hi) {
    const YAML::Node* n = Reader::find(m, field);
    return n == nullptr ? 0.0 : r.number(*n, what + "." + field, 0, false, hi);
  };
  auto coefficient = [&](const char* field, double hi) {
    return r.number(r.require(m, node, field, what), what + "." + field, 0, false, hi);
  };
  KernelFit fit;
  fit.fitted = true;
  fit.base_ns = coefficient("base_ns", 1e12);
  fit.ns_per_byte = coefficient("ns_per_byte", 1e6);
  fit.ns_per_flop = coefficient("ns_per_flop", 1e6);
  fit.ns_per_request = optional("ns_per_request", 1e9);
  fit.ns_per_split_row = optional("ns_per_split_row", 1e9);
  fit.r2 = r.number(r.require(m, node, "r2", what), what + ".r2", -1e300, false, 1);
  fit.max_rel_err = coefficient("max_rel_err", std::numeric_limits<double>::max());
  fit.samples =
      r.integer(r.require(m, node, "samples", what), what + ".samples", 1, int64_t(1) << 50);
  const YAML::Node* split = Reader::find(m, "split_intensity");
  const YAML::Node* split_bytes = Reader::find(m, "split_bytes");
  if (split != nullptr && split_bytes != nullptr) {
    r.fail(split_bytes->Mark(), what + ": split_intensity and split_bytes are exclusive");
  }
  if (split != nullptr || split_bytes != nullptr) {
    if (split != nullptr) {
      fit.split_intensity = r.number(*split, what + ".split_intensity", 0, true, 1e12);
    } else {
      fit.split_bytes = r.number(*split_bytes, what + ".split_bytes", 0, true, 1e18);
    }
    fit.wide_base_ns = coefficient("wide_base_ns", 1e12);
    fit.wide_ns_per_byte = coefficient("wide_ns_per_byte", 1e6);
    fit.wide_ns_per_flop = coefficient("wide_ns_per_flop", 1e6);
    fit.wide_ns_per_request = optional("wide_ns_per_request", 1e9);
  } else {
    for (const char* wide :
         {"wide_base_ns", "wide_ns_per_byte", "wide_ns_per_flop", "wide_ns_per_request"}) {
      if (const YAML::Node* n = Reader::find(m, wide)) {
        r.fail(n->Mark(), what + "." + wide + " needs " + what + ".split_intensity or " + what +
                              ".split_bytes");
      }
    }
  }
  return fit;
}

// A message size as calibrate-nccl writes it in measurement keys (8K, 256M, or bytes); 0 when
// the text is none.
int64_t size_bytes(const std::string& text) {
  int64_t v = 0;
  const auto res = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || res.ec != std::errc() || v < 1) return 0;
  const std::string suffix(res.ptr, text.data() + text.size());
  int shift = 0;
  if (suffix == "K") {
    shift = 10;
  } else if (suffix == "M") {
    shift = 20;
  } else if (suffix == "G") {
    shift = 30;
  } else if (!suffix.empty()) {
    return 0;
  }
  if (v > (int64_t(1) << (50 - shift))) return 0;  // 1 PiB: no message is larger
  return v << shift;
}

// The group size N of a measurement key's "r<N>" component: a whole number in [2, 2^20] without
// leading zeros; 0 when the text is none.
int32_t group_ranks(const std::string& text) {
  if (text.size() < 2 || text[0] != 'r' || text[1] == '0') return 0;
  int32_t n = 0;
  const auto res = std::from_chars(text.data() + 1, text.data() + text.size(), n);
  if (res.ec != std::errc() || res.ptr != text.data() + text.size() || n < 2 || n > (1 << 20)) {
    return 0;
  }
  return n;
}

// HardwareSpec::collective_tables from the measurements: every key
// nccl.<collective>.<mode>.<size>.median_ns is a point of a table measured on nccl.ranks GPUs,
// every key nccl.r<N>.<collective>.<mode>.<size>.median_ns one of a table measured on N GPUs
// (N != nccl.ranks). Other keys, other nccl.* ones included, are reported only.
void read_collective_tables(Reader& r,
                            const std::vector<std::pair<std::string, YAML::Node>>& measurements,
                            HardwareSpec& hw) {
  static const std::vector<std::string> kCollectives = {"all_reduce", "all_gather", "all_to_all",
                                                        "send_recv"};
  const YAML::Node* ranks_node = nullptr;
  for (const auto& [key, v] : measurements) {
    if (key == "nccl.ranks") ranks_node = &v;
  }
  // nccl.ranks, read where a table needs it: the primary group's size, or the size an r<N>
  // group must differ from. 0: not read yet.
  int32_t primary = 0;
  auto primary_ranks = [&](const std::string& what, const YAML::Node& at) {
    if (primary > 0) return primary;
    if (ranks_node == nullptr) {
      r.fail(at.Mark(), what +
                            " needs measurements.nccl.ranks (the number of GPUs the collectives "
                            "were measured on)");
    }
    const double g = r.number(*ranks_node, "measurements.nccl.ranks", 1, false, 1 << 20);
    if (g != std::floor(g)) {
      r.fail(ranks_node->Mark(), "measurements.nccl.ranks = " + ranks_node->Scalar() +
                                     " must be a whole number of GPUs");
    }
    primary = int32_t(g);
    return primary;
  };
  for (const auto& [key, v] : measurements) {
    if (!key.starts_with("nccl.") || !key.ends_with(".median_ns")) continue;
    const std::string what = "measurements." + key;
    std::vector<std::string> parts(1);
    for (const char c : key) {
      if (c == '.') {
        parts.emplace_back();
      } else {
        parts.back() += c;
      }
    }
    // nccl.r<N>.<...>: a further group; its table is read like the primary group's.
    int32_t ranks = 0;
    if (parts.size() == 6 && parts[1].starts_with("r")) {
      ranks = group_ranks(parts[1]);
      if (ranks == 0) {
        r.fail(v.Mark(), what + ": group '" + parts[1] +
                             "' must be r<N>, N the GPUs measured: a whole number in [2, "
                             "1048576], no leading zeros, as in r4");
      }
      parts.erase(parts.begin() + 1);
    }
    if (parts.size() != 5 ||
        std::find(kCollectives.begin(), kCollectives.end(), parts[1]) == kCollectives.end() ||
        (parts[2] != "eager" && parts[2] != "graph")) {
      r.fail(v.Mark(), what +
                           ": a collective time is nccl.COLLECTIVE.MODE.SIZE.median_ns or "
                           "nccl.r<N>.COLLECTIVE.MODE.SIZE.median_ns, COLLECTIVE one of " +
                           join(kCollectives) + ", MODE eager or graph");
    }
    const int64_t bytes = size_bytes(parts[3]);
    if (bytes == 0) {
      r.fail(v.Mark(), what + ": message size '" + parts[3] +
                           "' must be a byte count in [1, 2^50]: digits, optionally followed by "
                           "K, M or G (KiB, MiB, GiB), as in 8K or 256M");
    }
    const double ns = r.number(v, what, 0, true, 1e15);
    if (ranks == 0) {
      ranks = primary_ranks(what, v);
    } else if (ranks_node != nullptr && ranks == primary_ranks(what, v)) {
      r.fail(v.Mark(), what + ": r" + std::to_string(ranks) +
                           " is the primary group (measurements.nccl.ranks = " +
                           ranks_node->Scalar() + "); its times are nccl." + parts[1] + "." +
                           parts[2] + "." + parts[3] + ".median_ns");
    }
    const bool graph = parts[2] == "graph";
    auto table =
        std::find_if(hw.collective_tables.begin(), hw.collective_tables.end(),
                     [&](const HardwareSpec::CollectiveTable& t) {
                       return t.collective == parts[1] && t.graph == graph && t.ranks == ranks;
                     });
    if (table == hw.collective_tables.end()) {
      hw.collective_tables.push_back({parts[1], graph, ranks, {}});
      table = hw.collective_tables.end() - 1;
    }
    for (const HardwareSpec::CollectivePoint& q : table->points) {
      if (q.bytes == bytes) {
        r.fail(v.Mark(), what + ": a second time for " + parts[1] + " " + parts[2] + " on " +
                             std::to_string(ranks) + " ranks at " + std::to_string(bytes) +
                             " bytes");
      }
    }
    table->points.push_back({bytes, ns});
  }
  for (HardwareSpec::CollectiveTable& t : hw.collective_tables) {
    std::sort(t.points.begin(), t.points.end(),
              [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
  }
}

// ---- collective arrival skew (HardwareSpec::collective_skew, issue #11) ----------------------

// collective_skew: {ranks: G, COLLECTIVE: {MODE: [[skew_ns, extra_ns], ...]}}: COLLECTIVE one of
// all_reduce, all_gather, all_to_all; MODE eager or graph; skew_ns strictly ascending; both
// finite and >= 0.
void read_collective_skew(Reader& r, const YAML::Node& node, HardwareSpec& hw) {
  static const std::vector<std::string> kCollectives = {"all_reduce", "all_gather", "all_to_all"};
  std::vector<std::string> allowed = {"ranks"};
  allowed.insert(allowed.end(), kCollectives.begin(), kCollectives.end());
  const auto m = r.mapping(node, "collective_skew", allowed);
  const YAML::Node& ranks = r.require(m, node, "ranks", "collective_skew");
  hw.collective_skew_ranks = int32_t(r.integer(ranks, "collective_skew.ranks", 2, 1 << 20));
  for (const auto& [coll, cv] : m) {
    if (coll == "ranks") continue;
    const std::string cwhat = "collective_skew." + coll;
    for (const auto& [mode, tv] : r.mapping(cv, cwhat, {"eager", "graph"})) {
      const std::string what = cwhat + "." + mode;
      if (!tv.IsSequence() || tv.size() == 0) {
        r.fail(tv.Mark(), what + " must be a non-empty list of [skew_ns, extra_ns] points");
      }
      HardwareSpec::CollectiveSkewTable table{coll, mode == "graph", {}};
      for (size_t i = 0; i < tv.size(); ++i) {
        const YAML::Node& pt = tv[i];
        const std::string pwhat = what + "[" + std::to_string(i) + "]";
        if (!pt.IsSequence() || pt.size() != 2) {
          r.fail(pt.Mark(), pwhat + " must be a point [skew_ns, extra_ns]");
        }
        const HardwareSpec::SkewPoint p{r.number(pt[0], pwhat + ".skew_ns", 0, false, 1e12),
                                        r.number(pt[1], pwhat + ".extra_ns", 0, false, 1e12)};
        if (!table.points.empty() && p.skew_ns <= table.points.back().skew_ns) {
          r.fail(pt[0].Mark(),
                 pwhat + ".skew_ns = " + num(p.skew_ns) + " must exceed the previous point's " +
                     num(table.points.back().skew_ns) + " (points sorted by skew_ns, distinct)");
        }
        table.points.push_back(p);
      }
      hw.collective_skew.push_back(std::move(table));
    }
  }
}

// The section, after the measurements: the tables of the collectives read_collective_skew
// accepts, in its order (collective, then eager before graph; the first table of a pair), and
// nothing when there are none (so profiles without one are written as before).
void write_collective_skew(std::ostringstream& o, const HardwareSpec& hw) {
  std::string body;
  for (const char* coll : {"all_reduce", "all_gather", "all_to_all"}) {
    std::string modes;
    for (const bool graph : {false, true}) {
      const auto t =
          std::find_if(hw.collective_skew.begin(), hw.collective_skew.end(),
                       [&](const auto& x) { return x.collective == coll && x.graph == graph; });
      if (t == hw.collective_skew.end() || t->points.empty()) continue;
      modes += std::string("\n    ") + (graph ? "graph" : "eager") + ": [";
      for (size_t i = 0; i < t->points.size(); ++i) {
        modes += (i > 0 ? ", [" : "[") + num(t->points[i].skew_ns) + ", " +
                 num(t->points[i].extra_ns) + "]";
      }
      modes += "]";
    }
    if (!modes.empty()) body += std::string("\n  ") + coll + ":" + modes;
  }
  if (body.empty()) return;
  o << "# Collective arrival skew (calibrate-nccl): a collective whose members arrive skew_ns "
       "apart ends\n# extra_ns after the latest arrival plus its time; [skew_ns, extra_ns] "
       "points, linear between,\n# clamped outside; groups of `ranks` GPUs only.\n";
  o << "collective_skew:\n  ranks: " << hw.collective_skew_ranks << body << "\n";
}

// ---- speculative graphs (HardwareSpec::spec_graph_residuals, issue #6) ------------------------

// The graph kinds of simulator/spec_graphs.h (spec_graph_name) and the graph modes.
const std::vector<std::string>& spec_graph_kinds() {
  static const std::vector<std::string> kinds = {"draft", "draft_early_exit", "verify", "extend"};
  return kinds;
}

// spec_graph_residuals: a list of {model, graph, mode, batch, base_ns, ns_per_position,
// ns_per_position_ctx[, ns_per_extra_chunk][, ns_per_skipped_step], r2, max_rel_err,
// max_rel_err_unfitted, mean_err_unfitted, samples, points[, max_rel_err_loo, corrections]},
// the bracketed fields optional (absent: 0, none), the rest required; corrections a list of
// [positions, ctx, ns] sorted by (positions, ctx), distinct, positions >= 1, ctx >= 0, and
// max_rel_err_loo given with them; (model, graph, mode, batch) distinct.
void read_spec_graph_residuals(Reader& r, const YAML::Node& node, HardwareSpec& hw) {
  static const std::vector<std::string> kModes = {"graph", "pdl", "eager"};
  if (!node.IsSequence()) r.fail(node.Mark(), "spec_graph_residuals must be a list of fits");
  for (size_t i = 0; i < node.size(); ++i) {
    const YAML::Node& e = node[i];
    const std::string what = "spec_graph_residuals[" + std::to_string(i) + "]";
    const auto m = r.mapping(
        e, what,
        {"model", "graph", "mode", "batch", "base_ns", "ns_per_position", "ns_per_position_ctx",
         "ns_per_extra_chunk", "ns_per_skipped_step", "r2", "max_rel_err", "max_rel_err_unfitted",
         "mean_err_unfitted", "samples", "points", "max_rel_err_loo", "corrections"});
    auto field = [&](const char* name) -> const YAML::Node& { return r.require(m, e, name, what); };
    auto one_of = [&](const char* name, const std::vector<std::string>& allowed) {
      const std::string v = r.text(field(name), what + "." + name);
      if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
        r.fail(field(name).Mark(),
               what + "." + name + " '" + v + "' is not one of " + join(allowed));
      }
      return v;
    };
    HardwareSpec::SpecGraphResidual f;
    f.model = r.text(field("model"), what + ".model");
    if (f.model.empty()) r.fail(field("model").Mark(), what + ".model must not be empty");
    f.graph = one_of("graph", spec_graph_kinds());
    f.mode = one_of("mode", kModes);
    f.batch = r.integer(field("batch"), what + ".batch", 1, int64_t(1) << 20);
    f.base_ns = r.number(field("base_ns"), what + ".base_ns", -1e12, false, 1e12);
    f.ns_per_position =
        r.number(field("ns_per_position"), what + ".ns_per_position", -1e12, false, 1e12);
    f.ns_per_position_ctx =
        r.number(field("ns_per_position_ctx"), what + ".ns_per_position_ctx", -1e9, false, 1e9);
    if (const YAML::Node* c = Reader::find(m, "ns_per_extra_chunk")) {
      f.ns_per_extra_chunk = r.number(*c, what + ".ns_per_extra_chunk", -1e12, false, 1e12);
    }
    f.r2 = r.number(field("r2"), what + ".r2", -1e300, false, 1);
    f.max_rel_err = r.number(field("max_rel_err"), what + ".max_rel_err", 0, false, 1e300);
    f.max_rel_err_unfitted =
        r.number(field("max_rel_err_unfitted"), what + ".max_rel_err_unfitted", 0, false, 1e300);
    f.mean_err_unfitted =
        r.number(field("mean_err_unfitted"), what + ".mean_err_unfitted", -1e300, false, 1e300);
    f.samples = r.integer(field("samples"), what + ".samples", 1, int64_t(1) << 50);
    f.points = r.integer(field("points"), what + ".points", 1, int64_t(1) << 50);
    if (const YAML::Node* c = Reader::find(m, "ns_per_skipped_step")) {
      f.ns_per_skipped_step = r.number(*c, what + ".ns_per_skipped_step", -1e12, false, 1e12);
    }
    const YAML::Node* loo = Reader::find(m, "max_rel_err_loo");
    const YAML::Node* corr = Reader::find(m, "corrections");
    if ((loo == nullptr) != (corr == nullptr)) {
      r.fail(e.Mark(), what + ": max_rel_err_loo and corrections come together");
    }
    if (corr != nullptr) {
      f.max_rel_err_loo = r.number(*loo, what + ".max_rel_err_loo", 0, false, 1e300);
      if (!corr->IsSequence() || corr->size() == 0) {
        r.fail(corr->Mark(),
               what + ".corrections must be a non-empty list of [positions, ctx, ns]");
      }
      for (size_t k = 0; k < corr->size(); ++k) {
        const YAML::Node& pt = (*corr)[k];
        const std::string pwhat = what + ".corrections[" + std::to_string(k) + "]";
        if (!pt.IsSequence() || (pt.size() != 3 && pt.size() != 4)) {
          r.fail(pt.Mark(), pwhat +
                                " must be a point [positions, ctx, ns] or [positions, ctx, "
                                "ns, split_tokens]");
        }
        const HardwareSpec::SpecGraphResidual::Correction c{
            r.integer(pt[0], pwhat + ".positions", 1, int64_t(1) << 20),
            r.integer(pt[1], pwhat + ".ctx", 0, int64_t(1) << 40),
            r.number(pt[2], pwhat + ".ns", -1e12, false, 1e12),
            pt.size() == 4 ? r.integer(pt[3], pwhat + ".split_tokens", 1, int64_t(1) << 30) : 0};
        if (!f.corrections.empty()) {
          const auto& prev = f.corrections.back();
          if (std::tuple(c.positions, c.ctx, c.split_tokens) <=
              std::tuple(prev.positions, prev.ctx, prev.split_tokens)) {
            r.fail(pt.Mark(), pwhat + " must follow [" + std::to_string(prev.positions) + ", " +
                                  std::to_string(prev.ctx) +
                                  ", ...] (points sorted by positions, ctx, then split, "
                                  "distinct)");
          }
        }
        f.corrections.push_back(c);
      }
    }
    for (const HardwareSpec::SpecGraphResidual& q : hw.spec_graph_residuals) {
      if (q.model == f.model && q.graph == f.graph && q.mode == f.mode && q.batch == f.batch) {
        r.fail(e.Mark(), what + ": a second fit of " + f.model + " " + f.graph + " in mode " +
                             f.mode + " at batch " + std::to_string(f.batch));
      }
    }
    hw.spec_graph_residuals.push_back(std::move(f));
  }
}

// The section, after pdl_node_gap_by_rows; nothing when there are no fits (profiles without
// speculative samples are written as before).
void write_spec_graph_residuals(std::ostringstream& o, const HardwareSpec& hw) {
  if (hw.spec_graph_residuals.empty()) return;
  o << "# Speculative graphs: per model, graph, graph mode and batch, the measured launch less the "
       "simulator's\n# price, ns = base_ns + ns_per_position * P + ns_per_position_ctx * P * ctx "
       "(P: draft tokens,\n# or verify / extend width; ctx: cached tokens per request) + "
       "ns_per_extra_chunk * (16-row\n# GEMV chunks past the first, verify / extend), added to "
       "those launches of a one-GPU run in\n# that mode; errors of the price with and without "
       "it. ns_per_skipped_step: per conditional step an\n# early-exit draft graph skips past "
       "its length. corrections: [P, ctx, ns] what the form leaves at each\n# measured point, "
       "added between points (linear in ctx per P, held outside; then linear in P);\n# "
       "max_rel_err_loo: the error at each point priced without its own correction. A fourth\n# "
       "element: the attention split size measured (per context, the launch's nearest is used).\n";
  o << "spec_graph_residuals:";
  for (const HardwareSpec::SpecGraphResidual& f : hw.spec_graph_residuals) {
    o << "\n  - {model: " << quoted(f.model) << ", graph: " << quoted(f.graph)
      << ", mode: " << quoted(f.mode) << ", batch: " << f.batch << ", base_ns: " << num(f.base_ns)
      << ", ns_per_position: " << num(f.ns_per_position)
      << ", ns_per_position_ctx: " << num(f.ns_per_position_ctx);
    if (f.ns_per_extra_chunk != 0) o << ", ns_per_extra_chunk: " << num(f.ns_per_extra_chunk);
    o << ", r2: " << num(f.r2) << ", max_rel_err: " << num(f.max_rel_err)
      << ", max_rel_err_unfitted: " << num(f.max_rel_err_unfitted)
      << ", mean_err_unfitted: " << num(f.mean_err_unfitted) << ", samples: " << f.samples
      << ", points: " << f.points;
    if (f.ns_per_skipped_step != 0) o << ", ns_per_skipped_step: " << num(f.ns_per_skipped_step);
    if (!f.corrections.empty()) {
      o << ", max_rel_err_loo: " << num(f.max_rel_err_loo) << ", corrections: [";
      for (size_t k = 0; k < f.corrections.size(); ++k) {
        const auto& c = f.corrections[k];
        o << (k ? ", [" : "[") << c.positions << ", " << c.ctx << ", " << num(c.ns);
        if (c.split_tokens > 0) o << ", " << c.split_tokens;
        o << "]";
      }
      o << "]";
    }
    o << "}";
  }
  o << "\n";
}

CalibrationProfile parse_document(const YAML::Node& doc, Reader& r) {
  const auto top =
      r.mapping(doc, "the profile",
                {"format", "name", "base", "header", "figures", "kernels", "kernel_names",
                 "kernel_model_fits", "pdl_node_gap_by_rows", "graph_node_gap_by_rows",
                 "eager_node_gap_by_rows", "pdl_break_gap_by_rows", "graph_break_gap_by_rows",
                 "host_ops", "measurements", "collective_skew", "spec_graph_residuals"});
  CalibrationProfile p;
  const YAML::Node& format = r.require(top, doc, "format", "the profile");
  if (r.integer(format, "format", 0, 1000000) != kFormat) {
    r.fail(format.Mark(), "format " + format.Scalar() + " is not supported (this twinstep reads " +
                              std::to_string(kFormat) + ")");
  }
  p.name = r.text(r.require(top, doc, "name", "the profile"), "name");
  if (p.name.empty()) r.fail(r.require(top, doc, "name", "").Mark(), "name must not be empty");
  const YAML::Node& base = r.require(top, doc, "base", "the profile");
  p.base = r.text(base, "base");
  const std::vector<std::string> presets = hardware_preset_names();
  if (std::find(presets.begin(), presets.end(), p.base) == presets.end()) {
    r.fail(base.Mark(), "unknown base hardware preset '" + p.base + "'; known: " + join(presets));
  }
  p.hw = hardware_preset(p.base);
  p.hw.name = p.name;

  const YAML::Node& hn = r.require(top, doc, "header", "the profile");
  const auto h = r.mapping(hn, "header", {"command", "commit", "gpu", "driver", "date"});
  p.header.command = r.text(r.require(h, hn, "command", "header"), "header.command");
  p.header.commit = r.text(r.require(h, hn, "commit", "header"), "header.commit");
  p.header.gpu = r.text(r.require(h, hn, "gpu", "header"), "header.gpu");
  p.header.driver = r.text(r.require(h, hn, "driver", "header"), "header.driver");
  p.header.date = r.text(r.require(h, hn, "date", "header"), "header.date");
  p.hw.source = "calibrated profile '" + p.name + "' (" + p.header.gpu + ", " + p.header.date +
                ", commit " + p.header.commit + ") over preset " + p.base;

  if (const YAML::Node* fn = Reader::find(top, "figures")) {
    std::vector<std::string> names;
    for (const Figure& f : kFigures) names.push_back(f.name);
    for (const OptionalFigure& f : kOptionalFigures) names.push_back(f.name);
    for (const auto& [key, v] : r.mapping(*fn, "figures", names)) {
      const std::string field = "figures." + key;
      for (const Figure& f : kFigures) {
        if (key != f.name) continue;
        if (f.i64 != nullptr) {
          p.hw.*f.i64 = r.integer(v, field, 0, int64_t(1) << 40);
        } else {
          p.hw.*f.number = r.number(v, field, 0, f.positive, 1e9);
        }
      }
      for (const OptionalFigure& f : kOptionalFigures) {
        if (key != f.name) continue;
        if (f.i32 != nullptr) {
          p.hw.*f.i32 = int32_t(r.integer(v, field, 1, int64_t(1) << 30));
        } else {
          p.hw.*f.number = r.number(v, field, 0, /*lo_exclusive=*/false, 1e9);
        }
      }
    }
  }

  if (const YAML::Node* kn = Reader::find(top, "kernels")) {
    const std::vector<std::string> classes = kernel_class_names();
    for (const auto& [key, v] : r.mapping(*kn, "kernels", classes)) {
      const KernelFit fit = read_fit(r, v, "kernels." + key);
      for (int c = 0; c < int(KernelClass::kCount); ++c) {
        if (key == kernel_class_name(KernelClass(c))) p.hw.kernel_fits[size_t(c)] = fit;
      }
    }
  }
  if (const YAML::Node* kn = Reader::find(top, "kernel_names")) {
    for (const auto& [key, v] : r.mapping(*kn, "kernel_names", {})) {
      p.hw.kernel_name_fits.emplace_back(key, read_fit(r, v, "kernel_names." + key));
    }
  }
  if (const YAML::Node* mn = Reader::find(top, "kernel_model_fits")) {
    for (const auto& [model, mv] : r.mapping(*mn, "kernel_model_fits", {})) {
      const std::string mwhat = "kernel_model_fits." + model;
      HardwareSpec::ModelKernelFits fits{model, {}};
      for (const auto& [key, v] : r.mapping(mv, mwhat, {})) {
        fits.names.emplace_back(key, read_fit(r, v, mwhat + "." + key));
      }
      p.hw.kernel_model_fits.push_back(std::move(fits));
    }
  }
  for (const auto& [section, table] :
       {std::pair{"pdl_node_gap_by_rows", &p.hw.pdl_node_gap_by_rows},
        std::pair{"graph_node_gap_by_rows", &p.hw.graph_node_gap_by_rows},
        std::pair{"eager_node_gap_by_rows", &p.hw.eager_node_gap_by_rows},
        std::pair{"pdl_break_gap_by_rows", &p.hw.pdl_break_gap_by_rows},
        std::pair{"graph_break_gap_by_rows", &p.hw.graph_break_gap_by_rows}}) {
    const YAML::Node* gn = Reader::find(top, section);
    if (gn == nullptr) continue;
    for (const auto& [model, mv] : r.mapping(*gn, section, {})) {
      const std::string mwhat = std::string(section) + "." + model;
      int64_t prev = 0;
      for (const auto& [key, v] : r.mapping(mv, mwhat, {})) {
        const std::string what = mwhat + "." + key;
        int64_t rows = 0;
        const auto res = std::from_chars(key.data(), key.data() + key.size(), rows);
        if (key.empty() || res.ec != std::errc() || res.ptr != key.data() + key.size() ||
            rows <= prev || rows > (int64_t(1) << 30)) {
          r.fail(v.Mark(), what + ": keys must be row counts in [1, 2^30], ascending");
        }
        prev = rows;
        table->push_back({model, rows, r.integer(v, what, -(int64_t(1) << 40), int64_t(1) << 40)});
      }
    }
  }

  if (const YAML::Node* sn = Reader::find(top, "spec_graph_residuals")) {
    read_spec_graph_residuals(r, *sn, p.hw);
  }
  if (const YAML::Node* on = Reader::find(top, "host_ops")) {
    for (const auto& [key, v] : r.mapping(*on, "host_ops", {})) {
      p.host_ops.emplace_back(key, read_distribution(r, v, "host_ops." + key));
    }
  }
  if (const YAML::Node* mn = Reader::find(top, "measurements")) {
    const auto m = r.mapping(*mn, "measurements", {});
    for (const auto& [key, v] : m) {
      p.measurements.emplace_back(key, r.number(v, "measurements." + key, -1e300, false, 1e300));
    }
    read_collective_tables(r, m, p.hw);
  }
  if (const YAML::Node* sn = Reader::find(top, "collective_skew")) {
    read_collective_skew(r, *sn, p.hw);
  }
  return p;
}

}  // namespace

int32_t nccl_key_group(const std::string& key) {
  if (!key.starts_with("nccl.r")) return 0;
  const size_t dot = key.find('.', 5);
  return dot == std::string::npos ? 0 : group_ranks(key.substr(5, dot - 5));
}

std::string write_calibration_profile(const CalibrationProfile& p) {
  std::ostringstream o;
  o << "# twinstep calibrated hardware profile (docs/calibration.md). Written by twinstep "
       "calibrate.\n";
  o << "format: " << kFormat << "\n";
  o << "name: " << quoted(p.name) << "\n";
  o << "base: " << quoted(p.base) << "\n";
  o << "header:\n";
  o << "  command: " << quoted(p.header.command) << "\n";
  o << "  commit: " << quoted(p.header.commit) << "\n";
  o << "  gpu: " << quoted(p.header.gpu) << "\n";
  o << "  driver: " << quoted(p.header.driver) << "\n";
  o << "  date: " << quoted(p.header.date) << "\n";
  o << "figures:\n";
  for (const Figure& f : kFigures) {
    o << "  " << f.name << ": "
      << (f.i64 != nullptr ? std::to_string(p.hw.*f.i64) : num(p.hw.*f.number)) << "\n";
  }
  const HardwareSpec defaults;
  for (const OptionalFigure& f : kOptionalFigures) {
    if (f.i32 != nullptr && p.hw.*f.i32 != defaults.*f.i32) {
      o << "  " << f.name << ": " << p.hw.*f.i32 << "\n";
    } else if (f.number != nullptr && p.hw.*f.number != defaults.*f.number) {
      o << "  " << f.name << ": " << num(p.hw.*f.number) << "\n";
    }
  }
  o << "# Per kernel class: t_ns = base_ns + ns_per_byte * (bytes read + written) + ns_per_flop "
       "* flops\n# (+ ns_per_request * requests where given); r2, max_rel_err and samples describe "
       "the fit on\n# its own samples.\n";
  // `lead`: the newline and indentation before the entry.
  auto write_fit = [&](const std::string& key, const KernelFit& f, const char* lead = "\n  ") {
    o << lead << key << ": {base_ns: " << num(f.base_ns) << ", ns_per_byte: " << num(f.ns_per_byte)
      << ", ns_per_flop: " << num(f.ns_per_flop);
    if (f.ns_per_request > 0) o << ", ns_per_request: " << num(f.ns_per_request);
    if (f.ns_per_split_row > 0) o << ", ns_per_split_row: " << num(f.ns_per_split_row);
    o << ", r2: " << num(f.r2) << ", max_rel_err: " << num(f.max_rel_err)
      << ", samples: " << f.samples;
    if (f.split_intensity > 0 || f.split_bytes > 0) {
      o << (f.split_intensity > 0 ? ", split_intensity: " : ", split_bytes: ")
        << num(f.split_intensity > 0 ? f.split_intensity : f.split_bytes)
        << ", wide_base_ns: " << num(f.wide_base_ns)
        << ", wide_ns_per_byte: " << num(f.wide_ns_per_byte)
        << ", wide_ns_per_flop: " << num(f.wide_ns_per_flop);
      if (f.wide_ns_per_request > 0) o << ", wide_ns_per_request: " << num(f.wide_ns_per_request);
    }
    o << "}";
  };
  o << "kernels:";
  bool any = false;
  for (int c = 0; c < int(KernelClass::kCount); ++c) {
    const KernelFit& f = p.hw.kernel_fits[size_t(c)];
    if (!f.fitted) continue;
    any = true;
    write_fit(kernel_class_name(KernelClass(c)), f);
  }
  o << (any ? "\n" : " {}\n");
  if (!p.hw.kernel_name_fits.empty()) {
    o << "# Per kernel name (KernelDesc::name), the same model; a name listed here is priced by "
         "its own fit,\n# any other kernel by its class's.\n";
    o << "kernel_names:";
    for (const auto& [name, f] : p.hw.kernel_name_fits) write_fit(quoted(name), f);
    o << "\n";
  }
  if (!p.hw.kernel_model_fits.empty()) {
    o << "# Per calibration model (a preset, or <preset>@tp<N> for a TP shard) and kernel name, "
         "fitted on that\n# model's samples alone; a simulated run of the model (its shard on "
         "the run's layout) prices\n# these names by them before kernel_names.\n";
    o << "kernel_model_fits:";
    for (const HardwareSpec::ModelKernelFits& m : p.hw.kernel_model_fits) {
      o << "\n  " << quoted(m.model) << ":";
      for (const auto& [name, f] : m.names) write_fit(quoted(name), f, "\n    ");
      if (m.names.empty()) o << " {}";
    }
    o << "\n";
  }
  auto gap_table = [&](const char* section, const std::vector<HardwareSpec::NodeGap>& table,
                       const char* comment) {
    if (table.empty()) return;
    o << comment << section << ":";
    const std::string* model = nullptr;
    for (const HardwareSpec::NodeGap& g : table) {
      if (model == nullptr || *model != g.model) {
        o << (model != nullptr ? "}" : "") << "\n  " << quoted(g.model) << ": {";
        model = &g.model;
      } else {
        o << ", ";
      }
      o << g.rows << ": " << g.gap_ns;
    }
    o << "}\n";
  };
  gap_table(
      "pdl_node_gap_by_rows", p.hw.pdl_node_gap_by_rows,
      "# PDL node gap (ns, signed: negative = overlap) per model and decode rows; a step of R "
      "rows uses\n# the model's first entry with rows >= R, its last above it; other models "
      "pdl_node_gap_ns.\n");
  gap_table("graph_node_gap_by_rows", p.hw.graph_node_gap_by_rows,
            "# Graph-mode node gap (ns) of plain decode steps per model and rows, looked up the "
            "same way;\n# other models and other graph launches graph_node_gap_ns.\n");
  gap_table("eager_node_gap_by_rows", p.hw.eager_node_gap_by_rows,
            "# Eager node gap (ns) of decode steps per model and rows, looked up the same way;\n# "
            "other models and other eager launches eager_node_gap_ns.\n");
  gap_table("pdl_break_gap_by_rows", p.hw.pdl_break_gap_by_rows,
            "# The first node after a collective in a TP step (ns, signed): its mode's node gap "
            "plus this,\n# per shard and rows, from the shard's steps with a non-PDL empty kernel "
            "at each collective\n# position (calibrate --tp); PDL graphs, then plain graphs.\n");
  gap_table("graph_break_gap_by_rows", p.hw.graph_break_gap_by_rows, "");
  write_spec_graph_residuals(o, p.hw);
  o << "host_ops:";
  for (const auto& [name, d] : p.host_ops) {
    o << "\n  " << quoted(name) << ": {n: " << d.n << ", mean_ns: " << num(d.mean_ns)
      << ", p50_ns: " << num(d.p50_ns) << ", p90_ns: " << num(d.p90_ns)
      << ", p99_ns: " << num(d.p99_ns) << ", max_ns: " << num(d.max_ns) << "}";
  }
  o << (p.host_ops.empty() ? " {}\n" : "\n");
  o << "measurements:";
  for (const auto& [name, v] : p.measurements) o << "\n  " << quoted(name) << ": " << num(v);
  o << (p.measurements.empty() ? " {}\n" : "\n");
  write_collective_skew(o, p.hw);
  return o.str();
}

CalibrationProfile parse_calibration_profile(const std::string& text, const std::string& source) {
  Reader r(source);
  YAML::Node doc;
  try {
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    r.fail(e.mark, "malformed YAML: " + e.msg);
  }
  if (!doc.IsDefined() || doc.IsNull()) throw ConfigError(source + ":1:1", "empty profile");
  try {
    return parse_document(doc, r);
  } catch (const YAML::Exception& e) {
    r.fail(e.mark, "malformed YAML: " + e.msg);
  }
}

CalibrationProfile load_calibration_profile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path, "cannot read the calibration profile");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path, "cannot read the calibration profile");
  return parse_calibration_profile(text.str(), path);
}

void merge_collectives(CalibrationProfile& into, const std::vector<CalibrationProfile>& from,
                       const std::vector<std::string>& sources) {
  assert(from.size() == sources.size());
  // The group sizes carried so far, each with the source it came from.
  std::vector<std::pair<int32_t, std::string>> taken;
  auto taken_by = [&](int32_t ranks) -> const std::string* {
    for (const auto& [n, source] : taken) {
      if (n == ranks) return &source;
    }
    return nullptr;
  };
  auto is_nccl = [](const std::pair<std::string, double>& kv) {
    return kv.first.starts_with("nccl.");
  };
  std::erase_if(into.measurements, is_nccl);
  into.hw.collective_tables.clear();
  for (size_t i = 0; i < from.size(); ++i) {
    const CalibrationProfile& c = from[i];
    const std::string where = "--collectives-from " + sources[i];
    if (std::none_of(c.measurements.begin(), c.measurements.end(), is_nccl)) {
      throw ConfigError("",
                        where + ": the profile holds no nccl.* measurements (run calibrate-nccl)");
    }
    // Its primary group: nccl.ranks (read as a whole number by the parser where it has tables).
    int32_t primary = 0;
    for (const auto& [key, v] : c.measurements) {
      if (key == "nccl.ranks" && v >= 1 && v <= (1 << 20) && v == std::floor(v)) {
        primary = int32_t(v);
      }
    }
    std::vector<std::pair<int32_t, std::string>> added;
    auto add = [&](int32_t ranks) {
      if (std::none_of(added.begin(), added.end(),
                       [&](const auto& a) { return a.first == ranks; })) {
        added.emplace_back(ranks, sources[i]);
      }
    };
    if (i == 0) {
      // The first profile as a whole: its figures, tables, skew curves and nccl.* measurements.
      into.hw.interconnect_gbps = c.hw.interconnect_gbps;
      into.hw.allreduce_alpha_ns = c.hw.allreduce_alpha_ns;
      into.hw.alltoall_alpha_ns = c.hw.alltoall_alpha_ns;
      into.hw.p2p_alpha_ns = c.hw.p2p_alpha_ns;
      into.hw.collective_skew_ranks = c.hw.collective_skew_ranks;
      into.hw.collective_skew = c.hw.collective_skew;
      into.hw.collective_tables = c.hw.collective_tables;
      for (const auto& kv : c.measurements) {
        if (!is_nccl(kv)) continue;
        into.measurements.push_back(kv);
        if (const int32_t m = nccl_key_group(kv.first); m > 0) add(m);
      }
      if (primary > 0) add(primary);
      for (const HardwareSpec::CollectiveTable& t : c.hw.collective_tables) add(t.ranks);
    } else {
      const bool has_primary =
          primary > 0 && std::any_of(c.hw.collective_tables.begin(), c.hw.collective_tables.end(),
                                     [&](const auto& t) { return t.ranks == primary; });
      if (!has_primary) {
        throw ConfigError("", where +
                                  ": the profile holds no collective table of its own "
                                  "(nccl.ranks and nccl.COLLECTIVE.MODE.SIZE.median_ns); a "
                                  "further --collectives-from adds only its tables");
      }
      if (const std::string* other = taken_by(primary)) {
        throw ConfigError("", where + ": its collectives were measured on " +
                                  std::to_string(primary) +
                                  " GPUs (nccl.ranks), as were those of " + *other +
                                  ": give one profile per group size");
      }
      // Its own nccl.* keys as nccl.r<N>.* (N = primary), its nccl.r<M>.* where M is not taken;
      // its nccl.ranks and the skew rows (the skew curves come from the first profile) dropped.
      const std::string group = "nccl.r" + std::to_string(primary) + ".";
      for (const auto& [key, v] : c.measurements) {
        if (!key.starts_with("nccl.") || key == "nccl.ranks") continue;
        if (const int32_t m = nccl_key_group(key); m > 0) {
          const bool skew = key.find(".skew.") == key.find('.', 5);
          if (!skew && taken_by(m) == nullptr) {
            into.measurements.emplace_back(key, v);
            add(m);
          }
        } else if (!key.starts_with("nccl.skew.")) {
          const std::string renamed = group + key.substr(5);
          if (renamed.size() > Reader::kMaxKeyBytes) {
            throw ConfigError("", where + ": measurement " + key +
                                      " is too long to be written as " + group + "* (at most " +
                                      std::to_string(Reader::kMaxKeyBytes) + " characters)");
          }
          into.measurements.emplace_back(renamed, v);
        }
      }
      for (const HardwareSpec::CollectiveTable& t : c.hw.collective_tables) {
        if (t.ranks != primary && taken_by(t.ranks) != nullptr) continue;
        into.hw.collective_tables.push_back(t);
        add(t.ranks);
      }
    }
    taken.insert(taken.end(), added.begin(), added.end());
    into.header.command += "; collectives from " + sources[i] + " (" + c.header.command + ")";
  }
}

std::string calibration_profile_dir() {
  const char* env = std::getenv("TWINSTEP_PROFILES");
  if (env != nullptr && *env != '\0') return env;
  return TWINSTEP_DEFAULT_PROFILE_DIR;
}

std::vector<std::string> calibration_profile_names() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(calibration_profile_dir(), ec)) {
    if (e.path().extension() == ".yaml") names.push_back(e.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> names = hardware_preset_names();
  for (const std::string& n : calibration_profile_names()) names.push_back(n);
  return names;
}

HardwareSpec hardware_by_name(const std::string& name) {
  const std::vector<std::string> presets = hardware_preset_names();
  if (std::find(presets.begin(), presets.end(), name) != presets.end()) {
    return hardware_preset(name);
  }
  const std::string dir = calibration_profile_dir();
  const std::vector<std::string> profiles = calibration_profile_names();
  const std::string available =
      "presets: " + join(presets) + "; calibrated profiles in " + dir + ": " + join(profiles);
  if (std::find(profiles.begin(), profiles.end(), name) == profiles.end()) {
    throw ConfigError("", "unknown hardware '" + name + "'; " + available);
  }
  const std::string path = (std::filesystem::path(dir) / (name + ".yaml")).string();
  try {
    CalibrationProfile p = load_calibration_profile(path);
    if (p.name != name) {
      throw ConfigError(
          path, "profile name '" + p.name + "' does not match its file name '" + name + ".yaml'");
    }
    return p.hw;
  } catch (const ConfigError& e) {
    throw ConfigError("", std::string(e.what()) + " (" + available + ")");
  }
}

}  // namespace twinstep
