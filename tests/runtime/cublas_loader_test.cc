// cuBLAS loaded on first use (runtime/cublas_loader.h): needs the toolkit's libcublas, not a GPU.
#include "runtime/cublas_loader.h"

#include <gtest/gtest.h>

#include <latch>
#include <string>
#include <thread>
#include <vector>

namespace twinstep::runtime {
namespace {

// First in the file, so the threads race for the first load (ctest runs each test in its own
// process): every caller gets the one table, fully resolved.
TEST(CublasLoader, ConcurrentFirstCallsShareOneTable) {
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<const CublasApi*> seen(kThreads, nullptr);
  std::vector<CublasGemmExFn> gemm(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      const CublasApi& api = cublas_api();
      seen[t] = &api;
      gemm[t] = api.gemm_ex;
    });
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(seen[t], seen[0]) << "thread " << t;
    EXPECT_NE(gemm[t], nullptr) << "thread " << t;
    EXPECT_EQ(gemm[t], gemm[0]) << "thread " << t;
  }
}

TEST(CublasLoader, ResolvesEveryEntryPointOnce) {
  const CublasApi& api = cublas_api();
  EXPECT_NE(api.create, nullptr);
  EXPECT_NE(api.destroy, nullptr);
  EXPECT_NE(api.set_stream, nullptr);
  EXPECT_NE(api.set_math_mode, nullptr);
  EXPECT_NE(api.set_workspace, nullptr);
  EXPECT_NE(api.gemm_ex, nullptr);
  ASSERT_NE(api.status_string, nullptr);
  // Calls into the loaded library that need no device.
  const std::string not_initialized = api.status_string(CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_NE(not_initialized.find("not initialized"), std::string::npos) << not_initialized;
  EXPECT_NE(not_initialized, api.status_string(CUBLAS_STATUS_SUCCESS));
  const std::string path = cublas_library_path();
  EXPECT_NE(path.find("libcublas.so." + std::to_string(CUBLAS_VER_MAJOR)), std::string::npos)
      << path;
  EXPECT_EQ(&cublas_api(), &api);  // loaded once
  EXPECT_EQ(cublas_api().gemm_ex, api.gemm_ex);
}

}  // namespace
}  // namespace twinstep::runtime
