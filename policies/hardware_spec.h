// HardwareSpec: the figures the cost model needs for one GPU and its host. Datasheet presets
// name their source per field; a calibrated profile (from `twinstep calibrate`) replaces the
// measured fields without changing this interface.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace twinstep {

// A kernel-time model fitted by `twinstep calibrate` for one kernel class (simulator/
// calibration.h): t_ns = base_ns + ns_per_byte · (bytes read + written) + ns_per_flop · flops
// + ns_per_request · requests (attention only: its time grows with the (request, KV head)
// blocks at equal bytes), every coefficient >= 0. With split_intensity > 0 the class has two
// regimes: kernels whose flops / bytes exceed it use the wide_* coefficients (a projection's flops
// / bytes is about its row count, and the runtime switches from GEMV to cuBLAS above 16 rows). The
// quality figures are those of the fit on its own samples, both regimes together. kernel_floor_ns
// does not apply to a fitted class (base_ns is its measured floor).
struct KernelFit {
  bool fitted = false;  // false: the class is priced by the roofline below
  double base_ns = 0;
  double ns_per_byte = 0;
  double ns_per_flop = 0;
  double ns_per_request = 0;  // per request the kernel serves (KernelDesc::requests)
  // Per GEMV row per extra split CTA, gemv_split_rows() (policies/step_kernels.h): kGemm, below
  // the split only; 0 when absent.
  double ns_per_split_row = 0;
  double split_intensity = 0;  // flops per byte; 0: one regime
  // Bytes (read + written); > 0: kernels moving more use the wide_* coefficients (attention:
  // small kernels are latency-bound, large ones stream at a higher marginal bandwidth). At most
  // one of split_intensity and split_bytes is set.
  double split_bytes = 0;
  double wide_base_ns = 0;
  double wide_ns_per_byte = 0;
  double wide_ns_per_flop = 0;
  double wide_ns_per_request = 0;
  double r2 = 0;           // coefficient of determination on the samples
  double max_rel_err = 0;  // max |fit - measured| / measured over the samples
  int64_t samples = 0;
};

// Indexed by KernelClass (policies/step_kernels.h, which includes this header through
// layout.h); the cost model asserts KernelClass::kCount fits.
inline constexpr size_t kKernelFitSlots = 16;

struct HardwareSpec {
  std::string name;
  std::string source;  // where the numbers come from (datasheet, measurement, command)
  int64_t hbm_bytes = 0;
  double hbm_tbps = 0;          // datasheet HBM bandwidth, TB/s (1e12 B/s)
  double stream_read_tbps = 0;  // best streaming-read bandwidth a kernel reaches, TB/s
  double bf16_tflops = 0;       // dense bf16 tensor-core rate, TFLOP/s
  int32_t sm_count = 0;
  int64_t l2_bytes = 0;
  double interconnect_gbps = 0;  // per-GPU NVLink bandwidth, GB/s (one direction)

  // Cost-model knobs (roofline: time = max(bytes / (bw·mem_eff), flops / (peak·flop_eff)),
  // at least kernel_floor_ns).
  double mem_efficiency = 0.9;
  double flop_efficiency = 0.7;
  int64_t kernel_floor_ns = 2000;

  // ---- Beyond the calibrated range (issue #6; docs/calibration.md "Prefill") ----
  // The kernel fits hold for kernels of at most kernel_fit_max_rows token rows (KernelDesc::rows):
  // the largest decode batch their samples were measured at. A fitted kernel of more rows (a
  // prefill, a wide verify) costs its fit's base plus the roofline max(bytes / stream_read_tbps,
  // flops / compute rate below); one of fewer rows its fit, but never less than max(bytes /
  // stream_read_tbps, flops / bf16_tflops) (simulator/cost_model.h). Profiles without the figure:
  // 64, calibrate's largest decode batch.
  int32_t kernel_fit_max_rows = 64;
  // The roofline's compute rates beyond kernel_fit_max_rows, TFLOP/s, measured by `twinstep
  // calibrate` on the runtime's own prefill passes (prefill samples, simulator/prefill_fit.h);
  // 0: not measured, bf16_tflops · flop_efficiency (a datasheet peak times an assumed
  // efficiency). prefill_gemm_tflops: the cuBLAS projections and the LM head (kGemm, kLmHead);
  // prefill_moe_tflops: the grouped expert GEMMs (kMoeExperts, kernels/moe_prefill.cu).
  double prefill_gemm_tflops = 0;
  double prefill_moe_tflops = 0;
  // The rate at which attention beyond kernel_fit_max_rows reads (a prefill's chunks re-read
  // their KV prefixes, step_kernels' bytes), TB/s, measured likewise; 0: stream_read_tbps. The
  // prefixes are re-read by every later chunk and may come from L2.
  double prefill_attention_tbps = 0;

  // Launch and host-device figures.
  int64_t eager_launch_ns = 4000;   // host cost of one eager kernel launch
  int64_t graph_launch_ns = 5000;   // host cost of one cudaGraphLaunch
  int64_t graph_node_gap_ns = 600;  // GPU gap between consecutive graph nodes
  int64_t pdl_node_gap_ns = 200;    // the same with programmatic dependent launch
  // GPU gap between consecutive eagerly launched kernels of one stream, each queued before its
  // predecessor ended (a graph's nodes are closer). Estimate for the H200 from
  // results/h200/decode.json (b6a5f5f, Llama-3-8B, batch 1, run-ahead): eager 4.834 / 5.247 ms vs
  // graph 4.518 / 4.930 ms at prompt 128 / 8192 over 323 nodes, + 0.98 us on the 0.59 us graph
  // gap = 1.57 us. `twinstep calibrate` measures it (node_gap samples of mode eager).
  int64_t eager_node_gap_ns = 1570;
  int64_t d2h_latency_ns = 5000;  // a small device-to-host copy, issue to completion
  double d2h_gbps = 25;           // pinned device-to-host bandwidth, GB/s
  int64_t host_wake_ns = 2000;    // event synchronise: completion to host resuming

  // Collectives: time = alpha + algorithm bytes / interconnect bandwidth (ring all-reduce moves
  // 2(g-1)/g of the message per rank; all-gather and all-to-all (g-1)/g of what a rank receives).
  int64_t allreduce_alpha_ns = 8000;  // assumption: NCCL small all-reduce in a graph, one node
  int64_t alltoall_alpha_ns = 15000;  // assumption
  int64_t p2p_alpha_ns = 6000;        // assumption: NCCL send/recv between two GPUs of a node

  // Measured collective times (`twinstep calibrate-nccl`): per collective, mode and group size
  // (the GPUs of the communicator measured), the median time by message size. A calibrated
  // profile carries them as measurements: nccl.<collective>.<mode>.<size>.median_ns on nccl.ranks
  // GPUs, and nccl.r<N>.<collective>.<mode>.<size>.median_ns on N GPUs. The cost model
  // interpolates the table of a collective's group size (send/recv: any pair, the table of the
  // fewest ranks >= 2) and uses the alpha-beta model above where there is none.
  struct CollectivePoint {
    int64_t bytes = 0;  // nccl-tests' message bytes: the all-reduce buffer, the all-gather
                        // output, what one rank sends in an all-to-all, the send/recv buffer
    double median_ns = 0;
  };
  struct CollectiveTable {
    std::string collective;               // all_reduce | all_gather | all_to_all | send_recv
    bool graph = true;                    // measured inside a captured CUDA graph, else eager
    int32_t ranks = 0;                    // GPUs it was measured on; <= 0: not used
    std::vector<CollectivePoint> points;  // bytes ascending, distinct, median_ns > 0
  };
  // (collective, graph, ranks) distinct.
  std::vector<CollectiveTable> collective_tables;

  // Calibrated per-class kernel times; a class without a fit uses the roofline. Collectives
  // use the tables or the alpha-beta model above.
  std::array<KernelFit, kKernelFitSlots> kernel_fits{};
  // Calibrated per-kernel-name fits (KernelDesc::name: "qkv_proj", "lm_head", ...): a kernel
  // whose name has one is priced by it, any other by its class's fit (kernel_fits) or the
  // roofline. Projections of one class differ in efficiency (shape, cuBLAS algorithm), so a
  // name fit is closer; a new model's kernels carry the same names.
  std::vector<std::pair<std::string, KernelFit>> kernel_name_fits;
  // Calibrated per-(model, kernel name) fits: one entry per calibration model label
  // (policies/calibration_model.h: a preset, or "<preset>@tp<N>" for a TP shard), models
  // distinct, each fitted on that model's samples alone. A kernel_name_fits entry pools every
  // model's samples of a name; a model's own kernels fit its own line better. The cost model of
  // a run prices a kernel by its model's fit for the name, else by kernel_name_fits, else by
  // the class fit (CostModel resolves this once, at construction).
  struct ModelKernelFits {
    std::string model;
    std::vector<std::pair<std::string, KernelFit>> names;  // names distinct
  };
  std::vector<ModelKernelFits> kernel_model_fits;
  // Measured PDL node gap per model and rows (tokens) of the decode step, for the models
  // measured: a step of R rows uses the model's entry of the smallest rows >= R (the runtime pads
  // a batch to the next power of two), its last entry above it. Signed: a negative gap is an
  // overlap (PDL lets a kernel's prologue run under its predecessor's tail), which shortens the
  // busy time instead of adding idle. The overlap depends on the kernel mix (by batch it goes
  // from -1 us to +9.5 us per node on Llama-3-8B), so a model never measured uses
  // pdl_node_gap_ns, the gap alone.
  struct NodeGap {
    std::string model;
    int64_t rows = 0;
    int64_t gap_ns = 0;
  };
  std::vector<NodeGap> pdl_node_gap_by_rows;  // grouped by model, rows ascending in a model
  // The same for plain CUDA-graph decode steps (Phase::kDecode launches): the gap per node that
  // reproduces the measured unprofiled graph steps of the model and rows over their priced
  // kernels. Other launches in graph mode (speculative graphs, whose residuals are fitted against
  // graph_node_gap_ns) and models never measured use graph_node_gap_ns.
  std::vector<NodeGap> graph_node_gap_by_rows;
  // The same for eager decode steps: the gap per node that reproduces the measured eager steps
  // of the model and rows over their priced kernels (the runtime's host launches each kernel;
  // its cost per node depends on the kernel mix as PDL's does). Other models and eager launches
  // of other phases use eager_node_gap_ns.
  std::vector<NodeGap> eager_node_gap_by_rows;
  // What a collective inside a TP graph costs its neighbours (`twinstep calibrate --tp N`,
  // collective_break samples): the shard's step measured alone with an empty non-PDL kernel at
  // each collective position, less the plain step, per position, less one empty kernel's node
  // time in a graph (graph_node_gap_ns). The first node after a collective then gets its mode's
  // node gap plus this (signed), looked up by the shard's label ("<model>@tp<N>", whether or not
  // its node gaps are measured) and rows as above; where the table has no entry for the shard,
  // max(gap, graph_node_gap_ns) (the simulator's earlier rule).
  std::vector<NodeGap> pdl_break_gap_by_rows;
  std::vector<NodeGap> graph_break_gap_by_rows;

  // ---- Speculative graphs (issue #6; `twinstep calibrate`, docs/calibration.md "Speculative
  // graphs") ----
  // The runtime's draft / verify / extend graphs measured in situ, less what the simulator
  // prices for the same launch (simulator/spec_graphs.h spec_graph_price_ns): per model, graph
  // kind, graph mode and batch, ns = base_ns + ns_per_position · P + ns_per_position_ctx · P ·
  // ctx + ns_per_extra_chunk · C, P the draft tokens of a draft launch (the runtime runs P draft
  // forwards) or the width of a verify / extend launch, ctx the cached tokens per request, C the
  // 16-row GEMV chunks past the first of a verify / extend (spec_graph_extra_chunks: these graphs
  // read every weight once per chunk of the padded batch × width rows, where the simulator
  // prices more than 16 rows as one GEMM; 0 for drafts). Signed: the simulator prices the
  // NEXTN split (P − 1 draft forwards, a full draft forward in extend), the runtime P forwards
  // and an extend that writes only the draft layer's K/V. A one-GPU run adds it to those
  // launches in that mode (spec_graph_residual_for: the smallest measured batch >= the launch's
  // requests, the largest above), the launch's span held at >= 0.
  struct SpecGraphResidual {
    std::string model;  // calibration model label (a preset: the graphs run on one GPU)
    std::string graph;  // draft | draft_early_exit | verify | extend (spec_graph_name)
    std::string mode;   // graph | pdl | eager: the graph mode measured
    int64_t batch = 0;  // requests of the measured launches
    double base_ns = 0;
    double ns_per_position = 0;
    double ns_per_position_ctx = 0;   // per position and cached token of a request
    double ns_per_extra_chunk = 0;    // per 16-row chunk past the first (verify, extend)
    double r2 = 0;                    // of the fit on the residuals (unweighted)
    double max_rel_err = 0;           // max |price + residual − measured| / measured
    double max_rel_err_unfitted = 0;  // the same without the residual
    double mean_err_unfitted = 0;     // mean (price − measured) / measured, signed, no residual
    int64_t samples = 0;              // launches measured
    int64_t points = 0;               // (positions, context) medians fitted
    // draft_early_exit: per conditional step the graph skips (a graph of S steps that stops at
    // L drafts skips S − L), from calibrate's draft_early_exit_skip samples; 0 when unmeasured.
    double ns_per_skipped_step = 0;
    // What the form above leaves at each measured point: measured − (price + form), by
    // (positions, ctx per request). Priced between the points (spec_graph_residual_ns): linear
    // in ctx among a measured width's points (per context the split nearest the launch's), held
    // beyond its first and last, then linear in positions between measured widths (held beyond).
    // Sorted by (positions, ctx, split_tokens), distinct.
    // split_tokens: the attention split size of the engine the point was measured in
    // (kernels/attention_split.h: it follows the KV capacity; 0: not recorded); a context
    // measured at several partitions has a correction per split size, and a launch takes the one
    // of the split nearest its own (docs/calibration.md "Attention partition").
    struct Correction {
      int64_t positions = 0;
      int64_t ctx = 0;
      double ns = 0;
      int64_t split_tokens = 0;
    };
    std::vector<Correction> corrections;
    // With the corrections, the max relative error at a point priced without its own (leave
    // one out: how the interpolation does where nothing was measured); 0 without corrections.
    double max_rel_err_loo = 0;
  };
  std::vector<SpecGraphResidual> spec_graph_residuals;  // (model, graph, mode, batch) distinct

  // ---- Collective arrival skew (issue #11; `twinstep calibrate-nccl`, docs/calibration.md
  // "Collectives") ----
  // A collective whose members reach it skew_ns apart (latest minus earliest arrival) ends
  // extra_ns after the latest arrival plus its time (collective_tables or alpha-beta): the late
  // rank's NCCL kernel runs longer than a synchronised one (2 H200s, graph all-reduce, TP2-EP2
  // batch 1: 7.4-7.5 us against 6.55 us). Per collective and mode one curve, measured on
  // collective_skew_ranks GPUs and applied to groups of that size only;
  // CostModel::collective_skew_extra_ns interpolates it linearly in skew_ns, clamped at both ends.
  struct SkewPoint {
    double skew_ns = 0;   // >= 0; strictly ascending within a table
    double extra_ns = 0;  // >= 0
  };
  struct CollectiveSkewTable {
    std::string collective;  // all_reduce | all_gather | all_to_all (send/recv: no rendezvous)
    bool graph = true;       // measured inside a captured CUDA graph, else eager
    std::vector<SkewPoint> points;  // at least one
  };
  int32_t collective_skew_ranks = 0;  // 0: no skew tables (every extra is 0)
  std::vector<CollectiveSkewTable> collective_skew;
};

// The PDL node gap of a step of `model` with `rows` rows: its own pdl_node_gap_by_rows entry;
// for a model without one, the median over the table's models of their entries for `rows` (a
// PDL overlap exists only between real kernels, and every model measured overlaps: docs/
// calibration.md "PDL gap of a model never measured"); pdl_node_gap_ns (the empty-kernel figure)
// where the table is empty.
int64_t pdl_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows);
// The graph-mode node gap of a plain decode step of `model` with `rows` rows
// (graph_node_gap_by_rows, else graph_node_gap_ns).
int64_t graph_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows);
// The eager node gap of a decode step of `model` with `rows` rows (eager_node_gap_by_rows, else
// eager_node_gap_ns).
int64_t eager_node_gap_for(const HardwareSpec& hw, const std::string& model, int64_t rows);
// The extra gap after a collective of a step of `model` with `rows` rows in PDL (`pdl`) or plain
// graph mode (pdl_break_gap_by_rows / graph_break_gap_by_rows); nullopt where the table has no
// entry for the model.
std::optional<int64_t> break_gap_for(const HardwareSpec& hw, bool pdl, const std::string& model,
                                     int64_t rows);
// The kernel_model_fits entry of `model`, or nullptr; points into hw.
const HardwareSpec::ModelKernelFits* kernel_model_fits_for(const HardwareSpec& hw,
                                                           const std::string& model);

// Presets by name: h100, h200, h20, b200, b300. Throws ConfigError for an unknown name.
const HardwareSpec& hardware_preset(const std::string& name);
std::vector<std::string> hardware_preset_names();

}  // namespace twinstep
