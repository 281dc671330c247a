// Fuzz target: experiment YAML text -> load_experiment_text. The contract under test: any input
// either loads into a valid Experiment or throws ConfigError (never another exception, a crash,
// UB, a hang or unbounded memory). Loaded variants small enough to simulate quickly are
// simulated, so values the loader accepts are also checked against the simulator's arithmetic.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "experiments/experiment.h"
#include "experiments/runner.h"
#include "policies/error.h"

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_experiment: invariant violated: %s\n", what);
    std::abort();
  }
}

// The loader's documented guarantees on a loaded variant (experiment.cc schema comment).
void check_variant(const twinstep::Variant& v) {
  const twinstep::WorkloadSpec& w = v.workload;
  require(w.num_requests >= 1, "requests >= 1");
  require(w.max_concurrency >= 1, "concurrency >= 1");
  require(w.input_len.lo >= 1 && w.input_len.lo <= w.input_len.hi, "1 <= input lo <= hi");
  require(w.output_len.lo >= 1 && w.output_len.lo <= w.output_len.hi, "1 <= output lo <= hi");
  require(!v.model.layers.empty(), "a model has layers");
  for (const twinstep::LayerSpec& l : v.model.layers) {
    require(l.attn.num_q_heads >= 1 && l.attn.num_kv_heads >= 1, "heads >= 1");
  }
  require(v.hardware.stream_read_tbps > 0 && v.hardware.bf16_tflops > 0, "rates > 0");
  require(v.trace.step_count >= 0 && v.trace.first_step >= 0, "trace range >= 0");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  twinstep::Experiment e;
  try {
    e = twinstep::load_experiment_text(text, "fuzz.yaml");
  } catch (const twinstep::ConfigError& error) {
    require(std::string(error.what()).rfind("fuzz.yaml", 0) == 0, "errors name the file");
    return 0;
  }
  require(!e.variants.empty() && e.variants.size() <= 1'000'000, "1..1e6 variants");
  require(!e.backends.empty(), "at least one backend");
  for (size_t i = 0; i < e.variants.size(); ++i) {
    require(e.variants[i].index == static_cast<int32_t>(i), "variant index == position");
    check_variant(e.variants[i]);
  }
  // Simulate the first variant when it is small: a few hundred steps of a shallow model.
  const twinstep::Variant& v = e.variants.front();
  const int64_t tokens = int64_t{v.workload.num_requests} * v.workload.output_len.hi;
  if (tokens <= 256 && v.model.layers.size() <= 64 && v.workload.input_len.hi <= 1'000'000) {
    const twinstep::RunRecord record = twinstep::simulate_variant(v);
    require(record.requests.size() == size_t(v.workload.num_requests), "one sample per request");
    for (const twinstep::RequestSample& r : record.requests) {
      require(r.end_ns >= r.first_token_ns && r.first_token_ns >= r.start_ns, "time order");
    }
  }
  return 0;
}
