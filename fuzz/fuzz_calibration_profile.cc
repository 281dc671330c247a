// Fuzz target: profile YAML -> parse_calibration_profile (policies/calibration_profile.h), the
// loader behind `hardware: NAME` for calibrated profiles. Contract: any input either parses or
// throws ConfigError starting with the source name; a parsed profile has the rates the cost
// model divides by positive and finite, kernel fits (class, name, model) finite, and survives the
// writer: parsing write_calibration_profile(p) succeeds and writes the same text again.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "policies/calibration_profile.h"
#include "policies/error.h"

namespace {

void require(bool ok, const std::string& what) {
  twinstep::fuzz::require(ok, "fuzz_calibration_profile", what);
}

bool positive(double x) { return std::isfinite(x) && x > 0; }

void check_hardware(const twinstep::HardwareSpec& hw) {
  require(positive(hw.stream_read_tbps) && positive(hw.hbm_tbps) && positive(hw.bf16_tflops),
          "bandwidth and compute rates finite > 0");
  require(positive(hw.mem_efficiency) && positive(hw.flop_efficiency), "efficiencies finite > 0");
  require(positive(hw.d2h_gbps), "d2h_gbps finite > 0");
  require(hw.kernel_floor_ns >= 0 && hw.eager_launch_ns >= 0 && hw.graph_launch_ns >= 0 &&
              hw.graph_node_gap_ns >= 0 && hw.pdl_node_gap_ns >= 0 && hw.d2h_latency_ns >= 0 &&
              hw.host_wake_ns >= 0,
          "times >= 0");
  auto check_fit = [](const twinstep::KernelFit& f) {
    if (!f.fitted) return;
    for (const double x : {f.base_ns, f.ns_per_byte, f.ns_per_flop, f.split_intensity,
                           f.split_bytes, f.wide_base_ns, f.wide_ns_per_byte, f.wide_ns_per_flop})
      require(std::isfinite(x) && x >= 0, "kernel fit coefficients finite >= 0");
    require(f.samples >= 0, "kernel fit sample count >= 0");
  };
  for (const twinstep::KernelFit& f : hw.kernel_fits) check_fit(f);
  for (const auto& [name, f] : hw.kernel_name_fits) check_fit(f);
  for (const twinstep::HardwareSpec::ModelKernelFits& m : hw.kernel_model_fits) {
    for (const auto& [name, f] : m.names) check_fit(f);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  twinstep::CalibrationProfile p;
  try {
    p = twinstep::parse_calibration_profile(text, "profile.yaml");
  } catch (const twinstep::ConfigError& e) {
    require(std::string_view(e.what()).starts_with("profile.yaml"), "errors name the source");
    return 0;
  }
  check_hardware(p.hw);
  const std::string written = twinstep::write_calibration_profile(p);
  twinstep::CalibrationProfile back;
  try {
    back = twinstep::parse_calibration_profile(written, "written.yaml");
  } catch (const twinstep::ConfigError& e) {
    require(false, std::string("the writer's text parses: ") + e.what());
  }
  require(twinstep::write_calibration_profile(back) == written,
          "write(parse(write(p))) == write(p)");
  return 0;
}
