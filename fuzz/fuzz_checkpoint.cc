// Fuzz target: a checkpoint directory -> Checkpoint::open (runtime/checkpoint.h): config.json
// parsing and the check of every tensor the config implies against the safetensors files.
// Input: config.json text, a NUL byte, model.safetensors.index.json text (empty: no index), a
// NUL byte, then the model.safetensors image (JSON cannot hold a raw NUL, so the split is
// unambiguous). Contract: open() either returns a checkpoint whose config is in the documented
// ranges and whose every tensor of llama_weight_list is BF16 bytes of the implied shape, equal
// to the input's bytes, or throws CheckpointError; an accepted config survives the writer
// (llama_config_json) and parser round trip unchanged. The config text is also parsed alone
// (parse_llama_config), so the config check is fuzzed without matching tensors.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "runtime/checkpoint.h"

namespace {

using twinstep::LlamaConfig;

void require(bool ok, const std::string& what) {
  twinstep::fuzz::require(ok, "fuzz_checkpoint", what);
}

// The ranges parse_llama_config documents, and what the rope table divides by.
void check_config(const LlamaConfig& c) {
  require(c.hidden >= 1 && c.vocab >= 1 && c.layers >= 1, "model sizes >= 1");
  if (c.moe()) {
    require(c.intermediate == 0, "an MoE config has no dense FFN");
    require(c.num_experts <= 1024 && int64_t{c.layers} * c.num_experts <= (int64_t{1} << 18),
            "at most 1024 experts per layer, 2^18 in all");
    require(c.top_k >= 1 && c.top_k <= c.num_experts, "1 <= top_k <= num_experts");
    require(c.expert_intermediate >= 1 && c.shared_intermediate >= 0, "expert widths");
  } else {
    require(c.intermediate >= 1, "dense FFN width >= 1");
  }
  require(c.q_heads >= 1 && c.kv_heads >= 1 && c.head_dim >= 1, "heads and head_dim >= 1");
  require(c.q_heads % c.kv_heads == 0, "q heads a multiple of KV heads");
  require(std::isfinite(c.rms_eps) && c.rms_eps > 0, "rms_eps finite > 0");
  require(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope_theta finite > 0");
  require(std::isfinite(c.rope_factor) && c.rope_factor >= 1, "rope factor finite >= 1");
  require(std::isfinite(c.rope_low_freq_factor) && std::isfinite(c.rope_high_freq_factor) &&
              c.rope_low_freq_factor > 0 && c.rope_low_freq_factor < c.rope_high_freq_factor,
          "0 < low_freq_factor < high_freq_factor (the llama3 rope divides by the difference)");
  require(c.rope_original_context >= 1 && c.rope_original_context <= double(1 << 30) &&
              c.rope_original_context == std::floor(c.rope_original_context),
          "original_max_position_embeddings an integer in [1, 2^30]");
}

bool same_config(const LlamaConfig& a, const LlamaConfig& b) {
  return a.hidden == b.hidden && a.intermediate == b.intermediate && a.vocab == b.vocab &&
         a.layers == b.layers && a.q_heads == b.q_heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim && a.rms_eps == b.rms_eps && a.rope_theta == b.rope_theta &&
         a.rope_factor == b.rope_factor &&
         (a.rope_factor == 1.0 || (a.rope_low_freq_factor == b.rope_low_freq_factor &&
                                   a.rope_high_freq_factor == b.rope_high_freq_factor &&
                                   a.rope_original_context == b.rope_original_context)) &&
         a.tie_embeddings == b.tie_embeddings && a.num_experts == b.num_experts &&
         a.top_k == b.top_k && a.expert_intermediate == b.expert_intermediate &&
         a.shared_intermediate == b.shared_intermediate &&
         (!a.moe() || a.norm_topk_prob == b.norm_topk_prob);
}

twinstep::fuzz::ScratchDir& scratch() {
  static twinstep::fuzz::ScratchDir dir("fuzz_checkpoint");
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t a = in.find('\0');
  const size_t b = a == std::string_view::npos ? a : in.find('\0', a + 1);
  if (b == std::string_view::npos) return 0;
  const std::string_view config = in.substr(0, a), index = in.substr(a + 1, b - a - 1),
                         image = in.substr(b + 1);

  // The config check alone (most configs never meet matching tensors).
  try {
    const LlamaConfig c = twinstep::parse_llama_config(std::string(config), "config.json");
    check_config(c);
    require(same_config(twinstep::parse_llama_config(twinstep::llama_config_json(c), "rt.json"), c),
            "config.json writer/parser round trip");
  } catch (const twinstep::CheckpointError& e) {
    require(std::string_view(e.what()).starts_with("config.json: "), "error names the file");
  }

  twinstep::fuzz::ScratchDir& dir = scratch();
  dir.reset();
  dir.write("config.json", config);
  if (!index.empty()) dir.write("model.safetensors.index.json", index);
  dir.write("model.safetensors", image);

  std::unique_ptr<twinstep::Checkpoint> ck;
  try {
    ck = twinstep::Checkpoint::open(dir.path());
  } catch (const twinstep::CheckpointError&) {
    return 0;
  }
  const LlamaConfig& c = ck->config();
  check_config(c);
  require(same_config(twinstep::parse_llama_config(twinstep::llama_config_json(c), "rt.json"), c),
          "config.json writer/parser round trip");

  // Every tensor the config implies: BF16 bytes of the implied shape, the input's own bytes.
  const uint64_t header_len =
      image.size() >= 8 ? [&] {
        uint64_t n = 0;
        for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(image[size_t(i)]);
        return n;
      }()
                        : 0;
  const twinstep::SafetensorsHeader h = twinstep::parse_safetensors_image(
      {reinterpret_cast<const std::byte*>(image.data()), image.size()}, "model.safetensors");
  for (const twinstep::WeightDesc& w : twinstep::llama_weight_list(c)) {
    uint64_t elements = 1;
    for (const int64_t d : w.shape) elements *= uint64_t(d);
    const std::span<const std::byte> bytes = ck->tensor(w.name);
    require(bytes.size() == 2 * elements, "tensor " + w.name + " has the implied size");
    const twinstep::TensorInfo* t = nullptr;
    for (const twinstep::TensorInfo& x : h.tensors)
      if (x.name == w.name) t = &x;
    require(t != nullptr && t->dtype == twinstep::DType::kBF16 && t->shape == w.shape,
            "tensor " + w.name + " is BF16 of the implied shape in the file");
    require(bytes.empty() || std::memcmp(bytes.data(), image.data() + 8 + header_len + t->begin,
                                         bytes.size()) == 0,
            "tensor " + w.name + " bytes are the file's");
  }
  return 0;
}
