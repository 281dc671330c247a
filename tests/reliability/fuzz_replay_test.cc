// Replays every input under tests/fuzz_regressions/<FUZZ_TARGET>/ through the fuzz target's own
// entry point (fuzz/fuzz_<FUZZ_TARGET>.cc, linked into this test without libFuzzer). A target
// aborts on a broken invariant, so a regression fails this test (and ctest) loudly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> regression_inputs() {
  const std::filesystem::path dir =
      std::filesystem::path(TWINSTEP_SOURCE_DIR) / "tests/fuzz_regressions" / FUZZ_TARGET;
  std::vector<std::string> files;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

class FuzzReplay : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzReplay, RunsClean) {
  std::ifstream in(GetParam(), std::ios::binary);
  ASSERT_TRUE(in) << GetParam();
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A regression that hangs (the yaml-cpp loop allocated without bound) must fail, not stall
  // CI: SIGALRM ends the process after 60 s (a fuzz input runs in milliseconds).
  alarm(60);
  EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
            0);
  alarm(0);
}

INSTANTIATE_TEST_SUITE_P(Inputs, FuzzReplay, ::testing::ValuesIn(regression_inputs()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = std::filesystem::path(info.param).filename();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FuzzReplay);

}  // namespace
