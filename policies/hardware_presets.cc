// Hardware presets. Datasheet figures name their source; launch and host-device figures were
// measured on an H200 (../shared/ANCHORS.md, 2026-11-29) and are reused as stand-ins on parts
// never measured, which is said in each preset's source string.
#include <algorithm>
#include <array>
#include <map>
#include <optional>

#include "policies/calibration_model.h"
#include "policies/error.h"
#include "policies/hardware_spec.h"

namespace twinstep {
namespace {

constexpr int64_t kGB = 1000LL * 1000 * 1000;
constexpr int64_t kMiB = 1024LL * 1024;
// Streaming-read bandwidth over datasheet HBM bandwidth, measured on the H200 (4.42 / 4.8);
// applied to parts whose streaming read was never measured.
constexpr double kStreamOverDatasheet = 4.42 / 4.8;

HardwareSpec with_h200_launch_figures(HardwareSpec h) {
  // ANCHORS.md, H200: eager empty-kernel launch 3.96 us; one node of a captured graph 0.59 us.
  h.eager_launch_ns = 3960;
  h.graph_node_gap_ns = 590;
  h.pdl_node_gap_ns = 200;  // assumption: PDL overlaps most of the node gap
  // results/h200/decode.json (b6a5f5f): (T_eager - T_graph) / 323 nodes + the graph gap.
  h.eager_node_gap_ns = 1570;
  h.graph_launch_ns = 5000;  // assumption: one cudaGraphLaunch call on the host
  h.d2h_latency_ns = 5000;   // assumption: small pinned copy, issue to completion
  h.d2h_gbps = 25;           // assumption: PCIe Gen5 x16 pinned, one direction, achieved
  h.host_wake_ns = 2000;     // assumption: cudaEventSynchronize wake-up
  return h;
}

std::map<std::string, HardwareSpec> build_presets() {
  std::map<std::string, HardwareSpec> p;

  HardwareSpec h100;
  h100.name = "h100";
  h100.source =
      "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s, BF16 989 TFLOPS "
      "dense (1979 with sparsity), NVLink 900 GB/s bidirectional; 132 SMs, 50 MB L2 (Hopper "
      "whitepaper). Streaming read = 0.92 x datasheet; launch figures measured on an H200";
  h100.hbm_bytes = 80 * kGB;
  h100.hbm_tbps = 3.35;
  h100.stream_read_tbps = 3.35 * kStreamOverDatasheet;
  h100.bf16_tflops = 989;
  h100.sm_count = 132;
  h100.l2_bytes = 50 * kMiB;
  h100.interconnect_gbps = 450;
  p[h100.name] = with_h200_launch_figures(h100);

  HardwareSpec h200;
  h200.name = "h200";
  h200.source =
      "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16 989 TFLOPS "
      "dense, NVLink 900 GB/s bidirectional; 132 SMs, 50 MB L2. Measured on one H200 "
      "(ANCHORS.md, 2026-11-29): best streaming read 4.42 TB/s, eager launch 3.96 us, graph node "
      "0.59 us";
  h200.hbm_bytes = 141 * kGB;
  h200.hbm_tbps = 4.8;
  h200.stream_read_tbps = 4.42;
  h200.bf16_tflops = 989;
  h200.sm_count = 132;
  h200.l2_bytes = 50 * kMiB;
  h200.interconnect_gbps = 450;
  p[h200.name] = with_h200_launch_figures(h200);

  HardwareSpec h20;
  h20.name = "h20";
  h20.source =
      "NVIDIA H20 141GB (the part in seed 004; HBM3e 4.8 TB/s; the original H20 had 96 GB HBM3 "
      "at 4.0 TB/s), BF16 148 TFLOPS dense, NVLink 900 GB/s bidirectional, per NVIDIA's H20 "
      "product brief; 78 SMs as commonly reported (not in the brief). Streaming read = 0.92 x "
      "datasheet; launch figures measured on an H200";
  h20.hbm_bytes = 141 * kGB;
  h20.hbm_tbps = 4.8;
  h20.stream_read_tbps = 4.8 * kStreamOverDatasheet;
  h20.bf16_tflops = 148;
  h20.sm_count = 78;
  h20.l2_bytes = 60 * kMiB;
  h20.interconnect_gbps = 450;
  p[h20.name] = with_h200_launch_figures(h20);

  HardwareSpec b200;
  b200.name = "b200";
  b200.source =
      "NVIDIA DGX/HGX B200 datasheet divided by 8 GPUs: 180 GB HBM3e and 8 TB/s per GPU, "
      "FP16/BF16 2.25 PFLOPS dense (4.5 with sparsity), NVLink 5 1.8 TB/s bidirectional; SM "
      "count and L2 not in the datasheet (148 SMs and 126 MB L2 as reported for the part). "
      "Streaming read = 0.92 x datasheet; launch figures measured on an H200";
  b200.hbm_bytes = 180 * kGB;
  b200.hbm_tbps = 8.0;
  b200.stream_read_tbps = 8.0 * kStreamOverDatasheet;
  b200.bf16_tflops = 2250;
  b200.sm_count = 148;
  b200.l2_bytes = 126 * kMiB;
  b200.interconnect_gbps = 900;
  p[b200.name] = with_h200_launch_figures(b200);

  HardwareSpec b300;
  b300.name = "b300";
  b300.source =
      "NVIDIA HGX B300 (Blackwell Ultra) datasheet divided by 8 GPUs: 288 GB HBM3e and 8 TB/s "
      "per GPU, FP16/BF16 2.25 PFLOPS dense (as B200; Blackwell Ultra raises FP4, not BF16), "
      "NVLink 5 1.8 TB/s bidirectional; 160 SMs and 126 MB L2 as reported for the part. "
      "Streaming read = 0.92 x datasheet; launch figures measured on an H200";
  b300.hbm_bytes = 288 * kGB;
  b300.hbm_tbps = 8.0;
  b300.stream_read_tbps = 8.0 * kStreamOverDatasheet;
  b300.bf16_tflops = 2250;
  b300.sm_count = 160;
  b300.l2_bytes = 126 * kMiB;
  b300.interconnect_gbps = 900;
  p[b300.name] = with_h200_launch_figures(b300);
  return p;
}

const std::map<std::string, HardwareSpec>& presets() {
  static const std::map<std::string, HardwareSpec> p = build_presets();
  return p;
}

}  // namespace

const HardwareSpec& hardware_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const auto& [k, v] : presets()) known += (known.empty() ? "" : ", ") + k;
    throw ConfigError("", "unknown hardware preset '" + name + "'; known: " + known);
  }
  return it->second;
}

std::vector<std::string> hardware_preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

}  // namespace twinstep

namespace twinstep {

namespace {

// `model`'s entry of the smallest rows >= `rows` in `table`, its last above them; nullopt where
// the table has none for the model.
std::optional<int64_t> node_gap_in(const std::vector<HardwareSpec::NodeGap>& table,
                                   const std::string& model, int64_t rows) {
  const HardwareSpec::NodeGap* last = nullptr;
  for (const HardwareSpec::NodeGap& g : table) {
    if (g.model != model) continue;
    if (rows <= g.rows) return g.gap_ns;
    last = &g;
  }
  return last != nullptr ? std::optional<int64_t>(last->gap_ns) : std::nullopt;
}

// The median over the models of `table` (at most 16, in table order; fused labels left out,
// is_fused_calibration_label) of each one's node_gap_in entry for `rows` (the lower middle of an
// even count), over the models measured at `rows` or more where there is one (a model's last
// entry stands for larger batches only when no model measured them); nullopt for an empty
// table. One pass over the table (grouped by model, rows ascending within a model); allocates
// nothing.
std::optional<int64_t> pooled_node_gap(const std::vector<HardwareSpec::NodeGap>& table,
                                       int64_t rows) {
  std::array<int64_t, 16> reached{}, all{};
  size_t n_reached = 0, n_all = 0;
  for (size_t i = 0; i < table.size() && n_all < all.size();) {
    size_t end = i + 1;
    while (end < table.size() && table[end].model == table[i].model) ++end;
    if (is_fused_calibration_label(table[i].model)) {
      i = end;
      continue;
    }
    size_t pick = i;  // the first entry with rows >= `rows`, else the last
    while (pick + 1 < end && table[pick].rows < rows) ++pick;
    all[n_all++] = table[pick].gap_ns;
    if (table[end - 1].rows >= rows) reached[n_reached++] = table[pick].gap_ns;
    i = end;
  }
  auto median = [](std::array<int64_t, 16>& v, size_t n) {
    std::sort(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
    return v[(n - 1) / 2];
  };
  if (n_reached > 0) return median(reached, n_reached);
  if (n_all > 0) return median(all, n_all);
  return std::nullopt;
}

}  // namespace

int64_t pdl_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows) {
  if (auto own = node_gap_in(hw.pdl_node_gap_by_rows, model, rows)) return *own;
  return pooled_node_gap(hw.pdl_node_gap_by_rows, rows).value_or(hw.pdl_node_gap_ns);
}

int64_t graph_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows) {
  return node_gap_in(hw.graph_node_gap_by_rows, model, rows).value_or(hw.graph_node_gap_ns);
}

int64_t eager_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows) {
  return node_gap_in(hw.eager_node_gap_by_rows, model, rows).value_or(hw.eager_node_gap_ns);
}

std::optional<int64_t> break_gap_for(const HardwareSpec& hw, bool pdl, const std::string& model,
                                     int64_t rows) {
  return node_gap_in(pdl ? hw.pdl_break_gap_by_rows : hw.graph_break_gap_by_rows, model, rows);
}

const HardwareSpec::ModelKernelFits* kernel_model_fits_for(const HardwareSpec& hw,
                                                           const std::string& model) {
  for (const HardwareSpec::ModelKernelFits& m : hw.kernel_model_fits) {
    if (m.model == model) return &m;
  }
  return nullptr;
}

}  // namespace twinstep
