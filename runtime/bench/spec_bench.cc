// Speculative decoding on the real runtime, measured (Llama-3-8B shape, synthetic target/draft
// pairs built at a fidelity, runtime/checkpoint.h): for each fidelity, the policies none,
// chain(5) and confidence in the modes device / host_late / host_blocking, run-ahead with CUDA
// graphs, batch 1 (requests one after another). Prints per run TPOT (mean over requests of
// (E2E - TTFT) / (out - 1)), the mean accept length (tokens committed per verified request-step)
// and the step-time estimate TPOT x accept length, side by side; writes OUT/spec.json.
//   twinstep_spec_bench --out DIR [--prompt 8192] [--output 256] [--requests 3]
//                       [--fidelity 0.5,0.95] [--threshold 0.2] [--commit SHA]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "policies/decode_loop.h"
#include "policies/model_spec.h"
#include "runtime/checkpoint.h"
#include "runtime/engine.h"
#include "runtime/real_backend.h"

using namespace twinstep;

namespace {

struct Row {
  double fidelity;
  std::string policy;
  double tpot_ms, accept_len, step_ms, busy_pct;
};

std::vector<double> parse_list(const std::string& s) {
  std::vector<double> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::stod(item));
  return v;
}

Row measure(runtime::Engine& engine, const ModelSpec& model, const WorkloadSpec& w,
            const SpecSpec& spec, const char* label, double fidelity) {
  PolicySpec p;  // run-ahead depth 1, CUDA graphs
  p.spec = spec;
  const std::vector<RequestSpec> requests = generate_requests(w);
  RunRecord record;
  DecodeLoop loop(p, w, requests, &record);
  const HostCostModel host(HostCostSpec{}, 1);
  RealOptions ro;
  ro.prompt_seed = 1;
  ro.spec = spec;
  RealBackend backend(engine, model, host, requests, ro);
  HostProgram* ranks[] = {&loop};
  backend.run(ranks, record);
  double tpot = 0;
  int n = 0;
  for (const RequestSample& q : record.requests) {
    if (q.output_len < 2) continue;
    tpot += double(q.end_ns - q.first_token_ns) / (q.output_len - 1) / 1e6;
    ++n;
  }
  int64_t committed = 0, verified = 0, busy = 0, dur = 0;
  for (const StepSample& s : record.steps) {
    busy += s.gpu_busy_ns;
    dur += s.dur_ns;
    if (s.draft_len == 0 && spec.method != SpecMethod::kNone) continue;
    committed += s.tokens;
    verified += s.batch;
  }
  Row r{fidelity,
        label,
        n ? tpot / n : 0,
        verified ? double(committed) / verified : 0,
        0,
        dur ? 100.0 * double(busy) / double(dur) : 0};
  r.step_ms = r.tpot_ms * r.accept_len;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir = ".", commit = "", fidelities = "0.5,0.95";
  int prompt = 8192, output = 256, requests = 3;
  double threshold = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "spec_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out")
      out_dir = next();
    else if (a == "--commit")
      commit = next();
    else if (a == "--prompt")
      prompt = std::stoi(next());
    else if (a == "--output")
      output = std::stoi(next());
    else if (a == "--requests")
      requests = std::stoi(next());
    else if (a == "--fidelity")
      fidelities = next();
    else if (a == "--threshold")
      threshold = std::stod(next());
    else {
      std::fprintf(stderr, "spec_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::string why;
  if (!real_backend_available(&why)) {
    std::fprintf(stderr, "spec_bench: %s\n", why.c_str());
    return 1;
  }
  const ModelSpec& model = model_preset("llama-3-8b");
  WorkloadSpec w;
  w.input_len = {prompt, prompt};
  w.output_len = {output, output};
  w.num_requests = requests;
  w.max_concurrency = 1;
  w.seed = 1;

  SpecSpec chain;
  chain.method = SpecMethod::kChain;
  chain.steps = 5;
  chain.draft_tokens = 6;
  auto conf = [&](DraftMode m) {
    SpecSpec s;
    s.method = SpecMethod::kConfidence;
    s.mode = m;
    s.threshold = threshold;
    s.min_steps = 1;
    s.max_steps = 8;
    s.lag = 1;
    return s;
  };
  const std::pair<const char*, SpecSpec> policies[] = {
      {"none", SpecSpec{}},
      {"chain(5)", chain},
      {"confidence/device", conf(DraftMode::kDevice)},
      {"confidence/host_late", conf(DraftMode::kHostLate)},
      {"confidence/host_blocking", conf(DraftMode::kHostBlocking)},
  };
  std::vector<Row> rows;
  std::printf(
      "Llama-3-8B shape, prompt %d, output %d, %d requests at concurrency 1, run-ahead "
      "graphs; confidence threshold %.2f, min 1, max 8 (device mode: the draft runs all "
      "max steps, lengths decided on the device — no early exit)\n",
      prompt, output, requests, threshold);
  std::printf("%9s %-26s %9s %11s %9s %7s\n", "fidelity", "policy", "tpot_ms", "accept_len",
              "step_ms", "busy%");
  for (double f : parse_list(fidelities)) {
    runtime::EngineOptions eo;
    const int32_t margin = 3 * (chain.max_draft() + 1) + 3 * 9;
    eo.capacity_tokens = (prompt + 15) / 16 * 16 + output + margin;
    eo.capacity_tokens = (eo.capacity_tokens + 63) / 64 * 64;
    eo.draft = true;
    auto print = [&](const Row& r) {
      std::printf("%9.2f %-26s %9.3f %11.3f %9.3f %7.1f\n", r.fidelity, r.policy.c_str(), r.tpot_ms,
                  r.accept_len, r.step_ms, r.busy_pct);
      std::fflush(stdout);
    };
    {
      auto engine = runtime::Engine::create_synthetic(llama_config_from_spec(model), 1, eo, f);
      for (const auto& [label, spec] : policies) {
        rows.push_back(measure(*engine, model, w, spec, label, f));
        print(rows.back());
      }
    }
    // The same device-mode policy with the draft's later steps behind conditional IF nodes.
    eo.draft_early_exit = true;
    auto early = runtime::Engine::create_synthetic(llama_config_from_spec(model), 1, eo, f);
    rows.push_back(
        measure(*early, model, w, conf(DraftMode::kDevice), "confidence/device+early_exit", f));
    print(rows.back());
  }
  std::ofstream js(out_dir + "/spec.json");
  js << "{\n  \"command\": \"twinstep_spec_bench --prompt " << prompt << " --output " << output
     << " --requests " << requests << " --fidelity " << fidelities << " --threshold " << threshold
     << "\",\n  \"commit\": \"" << commit << "\",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"fidelity\": " << r.fidelity << ", \"policy\": \"" << r.policy
       << "\", \"tpot_ms\": " << r.tpot_ms << ", \"accept_len\": " << r.accept_len
       << ", \"step_time_estimate_ms\": " << r.step_ms << ", \"gpu_busy_pct\": " << r.busy_pct
       << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  js << "  ]\n}\n";
  return js ? 0 : 1;
}
