// runtime/nccl_calibrate.h on one GPU: a 1-rank communicator (all-reduce is a copy, all-to-all
// and send/recv go to itself), so the benchmark loop runs eager and in captured graphs and
// every number comes out positive. The 2-GPU figures come from scripts/gpu_nccl.sh. Skips
// without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/nccl_calibrate.h"

namespace twinstep {
namespace {

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

TEST(NcclCalibrate, OneRankLoopRunsEagerAndInGraphs) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  NcclCalibrateOptions o;
  o.quick = true;  // 8K, 32K, 128K, 512K, 2M
  o.max_bytes = 2 << 20;
  o.ops = 4;
  o.reps = 3;
  o.warmup = 2;
  o.timeout_s = 60;
  const NcclCalibrationRun run = run_nccl_calibration(o);
  EXPECT_EQ(run.ranks, 1);
  EXPECT_EQ(run.rank, 0);
  EXPECT_FALSE(run.gpu_name.empty());
  EXPECT_FALSE(run.nccl_version.empty());
  ASSERT_EQ(run.points.size(), 4u * 5u * 2u);
  for (const NcclPoint& p : run.points) {
    const std::string what =
        std::string(nccl_collective_name(p.coll)) + " " + p.mode + " " + std::to_string(p.bytes);
    EXPECT_EQ(p.ranks, 1) << what;
    EXPECT_GT(p.bytes, 0) << what;
    EXPECT_EQ(p.ops, 4) << what;
    EXPECT_EQ(p.reps, 3) << what;
    EXPECT_GT(p.min_ns, 0) << what;
    EXPECT_LE(p.min_ns, p.median_ns) << what;
    EXPECT_LE(p.median_ns, p.p90_ns) << what;
    EXPECT_LT(p.median_ns, 1e8) << what;  // under 100 ms per collective
    EXPECT_GT(p.algbw_gbps(), 0) << what;
  }
  std::printf("%s", nccl_table(run.points).c_str());
  // One rank: the fits are constants; the profile's figures stay as they were.
  const std::vector<CollectiveFit> fits = fit_collectives(run.points);
  EXPECT_EQ(fits.size(), 8u);
  std::printf("%s", nccl_fit_report(fits).c_str());
  CalibrationProfile profile;
  profile.name = "one-rank";
  profile.base = "h200";
  profile.hw = hardware_preset("h200");
  const int64_t alpha = profile.hw.allreduce_alpha_ns;
  apply_nccl_calibration(profile, run.points, fits);
  EXPECT_EQ(profile.hw.allreduce_alpha_ns, alpha);
  EXPECT_FALSE(profile.measurements.empty());
}

// The single-process path (one thread per rank, for machines without MPI): every visible GPU
// up to 2. With 2 GPUs the ranks exchange over the link, so the fitted bandwidth is positive.
TEST(NcclCalibrate, OneThreadPerGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  NcclCalibrateOptions o;
  o.quick = true;
  o.min_bytes = 32 << 10;
  o.max_bytes = 8 << 20;  // 32K, 128K, 512K, 2M, 8M
  o.ops = 4;
  o.reps = 3;
  o.warmup = 2;
  o.timeout_s = 60;
  o.collectives = {NcclCollective::kAllReduce, NcclCollective::kSendRecv};
  o.threads = std::min(devices, 2);
  const NcclCalibrationRun run = run_nccl_calibration(o);
  EXPECT_EQ(run.ranks, o.threads);
  ASSERT_EQ(run.points.size(), 2u * 5u * 2u);
  for (const NcclPoint& p : run.points) {
    EXPECT_EQ(p.ranks, o.threads);
    EXPECT_GT(p.min_ns, 0);
    EXPECT_LE(p.median_ns, p.p90_ns);
  }
  std::printf("%s", nccl_table(run.points).c_str());
  if (o.threads == 2) {
    for (const CollectiveFit& f : fit_collectives(run.points)) {
      EXPECT_TRUE(f.fitted);
      EXPECT_GT(f.beta_gbps, 0) << nccl_collective_name(f.coll) << " " << f.mode;
    }
  }
}

}  // namespace
}  // namespace twinstep
