#include "policies/calibration_model.h"

#include <algorithm>
#include <optional>

#include "policies/error.h"

namespace twinstep {

CalibrationModel parse_calibration_model(const std::string& label) {
  CalibrationModel m;
  // "+norms", "+rope", "+norms+rope": the fusions, in that order.
  const size_t plus = std::min(label.find('+'), label.size());
  const std::string fused = label.substr(plus);
  if (fused == "+norms" || fused == "+norms+rope") m.fusion.norms = true;
  if (fused == "+rope" || fused == "+norms+rope") m.fusion.rope = true;
  if (!fused.empty() && !m.fusion.any()) {
    throw ConfigError("", "calibration model '" + label +
                              "': a fused label ends in +norms, +rope or +norms+rope");
  }
  const std::string base = label.substr(0, plus);
  const size_t at = base.rfind("@tp");
  m.preset = at == std::string::npos ? base : base.substr(0, at);
  if (at != std::string::npos) {
    const std::string digits = base.substr(at + 3);
    const bool numeric = !digits.empty() && digits.size() <= 2 &&
                         digits.find_first_not_of("0123456789") == std::string::npos;
    m.tp = numeric ? std::stoi(digits) : 0;
    if (m.tp < 2 || m.tp > 64) {
      throw ConfigError("", "calibration model '" + label +
                                "': a shard label is <preset>@tp<N> with N in [2, 64]");
    }
  }
  const ModelSpec& model = model_preset(m.preset);  // throws for an unknown preset
  if (const std::string why = kernel_fusion_error(model, m.fusion, m.tp); !why.empty())
    throw ConfigError("", "calibration model '" + label + "': " + why);
  return m;
}

std::string calibration_model_label(const std::string& preset, int32_t tp,
                                    const KernelFusion& fusion) {
  std::string label = tp <= 1 ? preset : preset + "@tp" + std::to_string(tp);
  if (fusion.norms) label += "+norms";
  if (fusion.rope) label += "+rope";
  return label;
}

bool is_fused_calibration_label(std::string_view label) {
  return label.find('+') != std::string_view::npos;
}

std::string fused_calibration_error(const KernelFusion& fusion,
                                    const std::vector<std::string>& presets, int32_t tp) {
  for (const std::string& p : presets) {
    const std::string why = kernel_fusion_error(model_preset(p), fusion, tp);
    if (!why.empty()) return "--fusion: " + why;
  }
  return {};
}

ModelSpec calibration_model_spec(const CalibrationModel& m) {
  ModelSpec spec = model_preset(m.preset);
  spec.fusion = m.fusion;
  return spec;
}

LayoutSpec calibration_layout(const ModelSpec& model, int32_t tp) {
  LayoutSpec l;
  l.tp = tp;
  const bool moe = !model.layers.empty() && model.layers[0].mlp.kind == MlpKind::kMoe;
  l.ep = moe ? tp : 1;
  l.vocab_parallel = false;
  return l;
}

void calibration_step_kernels(const std::string& label, const StepShape& shape, StepKernels& out) {
  const CalibrationModel cm = parse_calibration_model(label);
  shard_step_kernels(calibration_model_spec(cm), cm.tp, shape, out);
}

void shard_step_kernels(const ModelSpec& model, int32_t tp, const StepShape& shape,
                        StepKernels& out) {
  if (tp == 1) {
    step_kernels(model, shape, out);
    return;
  }
  StepKernels full;
  step_kernels(model, shape, calibration_layout(model, tp), 0, full);
  out.kernels.clear();
  out.runs.clear();
  for (const LayerRun& run : full.runs) {
    const auto first = static_cast<int32_t>(out.kernels.size());
    for (int32_t i = run.first; i < run.first + run.count; ++i) {
      const KernelDesc& k = full.kernels[static_cast<size_t>(i)];
      if (k.cls != KernelClass::kCollective) out.kernels.push_back(k);
    }
    out.runs.push_back({run.repeat, first, static_cast<int32_t>(out.kernels.size()) - first});
  }
}

ExpertShare calibration_expert_share(const std::string& label, int32_t layer,
                                     std::span<const int32_t> ids) {
  const CalibrationModel cm = parse_calibration_model(label);
  const ModelSpec& model = model_preset(cm.preset);
  if (layer < 0 || size_t(layer) >= model.layers.size() ||
      model.layers[size_t(layer)].mlp.kind != MlpKind::kMoe)
    throw ConfigError("", "calibration model '" + label + "': layer " + std::to_string(layer) +
                              " is not an MoE layer");
  const LayoutSpec l = cm.tp == 1 ? LayoutSpec{} : calibration_layout(model, cm.tp);
  return routed_expert_share(model.layers[size_t(layer)].mlp, ids, l.ep, 0);
}

void calibration_layer_kernels(const std::string& label, const StepShape& shape, int32_t layer,
                               const ExpertShare& routing, std::vector<KernelDesc>& out) {
  const CalibrationModel cm = parse_calibration_model(label);
  const ModelSpec model = calibration_model_spec(cm);
  layer_kernels(model, shape, cm.tp == 1 ? LayoutSpec{} : calibration_layout(model, cm.tp), 0,
                layer, routing, out);
  std::erase_if(out, [](const KernelDesc& k) { return k.cls == KernelClass::kCollective; });
}

namespace {

// The first of `model`'s fused shard, shard and name labels (calibration_model_label) for which
// `measured(label)` holds; the name when none does.
template <typename Measured>
std::string most_specific(const std::string& model, int32_t tp, const KernelFusion& fusion,
                          Measured measured) {
  const int32_t shard = std::max(tp, 1);
  if (fusion.any()) {
    std::string fused = calibration_model_label(model, shard, fusion);
    if (measured(fused)) return fused;
  }
  if (shard > 1) {
    std::string label = calibration_model_label(model, shard);
    if (measured(label)) return label;
  }
  return model;
}

}  // namespace

std::string pdl_gap_model(const HardwareSpec& hw, const std::string& model, int32_t tp,
                          const KernelFusion& fusion) {
  return most_specific(model, tp, fusion, [&](const std::string& label) {
    for (const HardwareSpec::NodeGap& g : hw.pdl_node_gap_by_rows) {
      if (g.model == label) return true;
    }
    return false;
  });
}

std::string kernel_fit_model(const HardwareSpec& hw, const std::string& model, int32_t tp,
                             const KernelFusion& fusion) {
  return most_specific(model, tp, fusion, [&](const std::string& label) {
    return kernel_model_fits_for(hw, label) != nullptr;
  });
}

namespace {

// A model's decode attention launch on rank 0 of a layout, as far as it decides the kernel's
// time: KV heads on the rank, head dim, KV element bytes, 16-row tiles of one query position's
// rows (query heads per KV head, padded to 16: 3 and 4 launch alike).
struct AttentionGeometry {
  int32_t kv_heads = 0, head_dim = 0, kv_bytes = 0, row_tiles = 0;
  bool operator==(const AttentionGeometry&) const = default;
};

// Nullopt unless every layer is GQA with one shape.
std::optional<AttentionGeometry> attention_geometry(const ModelSpec& model,
                                                    const LayoutSpec& layout) {
  if (model.layers.empty()) return std::nullopt;
  const AttentionSpec& a = model.layers[0].attn;
  for (const LayerSpec& l : model.layers) {
    if (l.attn.kind != AttentionKind::kGqa || l.attn.num_q_heads != a.num_q_heads ||
        l.attn.num_kv_heads != a.num_kv_heads || l.attn.head_dim != a.head_dim) {
      return std::nullopt;
    }
  }
  const LayerShard s = layer_shard(model.layers[0], layout, 0);
  if (s.kv_heads <= 0 || s.heads <= 0 || s.heads % s.kv_heads != 0) return std::nullopt;
  const int32_t group = s.heads / s.kv_heads;
  return AttentionGeometry{s.kv_heads, a.head_dim, kv_value_bytes(model, layout),
                           (group + 15) / 16};
}

bool has_attention_fit(const HardwareSpec::ModelKernelFits* fits) {
  if (fits == nullptr) return false;
  for (const auto& [name, f] : fits->names) {
    if (name == "attention" && f.fitted) return true;
  }
  return false;
}

}  // namespace

std::string attention_fit_model(const HardwareSpec& hw, const ModelSpec& model,
                                const LayoutSpec& layout) {
  const std::string own = kernel_fit_model(hw, model.name, layout.width(), model.fusion);
  if (has_attention_fit(kernel_model_fits_for(hw, own))) return {};
  const std::optional<AttentionGeometry> mine = attention_geometry(model, layout);
  if (!mine) return {};
  std::string other;  // the first donor whose attention ropes otherwise
  for (const HardwareSpec::ModelKernelFits& fits : hw.kernel_model_fits) {
    if (!has_attention_fit(&fits)) continue;
    CalibrationModel cm;
    try {
      cm = parse_calibration_model(fits.model);
    } catch (const ConfigError&) {
      continue;  // a label of no preset here: its geometry is unknown
    }
    const ModelSpec& theirs = model_preset(cm.preset);
    if (attention_geometry(theirs, calibration_layout(theirs, cm.tp)) != mine) continue;
    if (cm.fusion.rope == model.fusion.rope) return fits.model;
    if (other.empty()) other = fits.model;
  }
  return other;
}

std::map<std::string, std::pair<int32_t, int32_t>> calibration_gemv_shapes(
    const std::string& label) {
  std::map<std::string, std::pair<int32_t, int32_t>> shapes;
  StepKernels sk;
  try {
    calibration_step_kernels(label, decode_shape(1, 1, 0), sk);
  } catch (const ConfigError&) {
    return shapes;
  }
  for (const KernelDesc& k : sk.kernels) {
    if (k.cls == KernelClass::kGemm && k.gemv_n > 0) shapes[k.name] = {k.gemv_n, k.gemv_k};
  }
  return shapes;
}

}  // namespace twinstep
