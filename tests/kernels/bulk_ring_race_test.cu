// A standalone copy of gemv_kernel's bulk-copy stage ring (fill 0) for compute-sanitizer racecheck:
// one producer warp fills a ring of shared-memory stages with cp.async.bulk row copies completing
// on full[s] mbarriers (transaction bytes), the activation rows of the first `kStages` stages
// issued late as after gemv's PDL wait; four consumer warps wait on full[s], read the stage with
// ldmatrix, run mma.m16n8k16 and release it on empty[s]; the producer waits on empty[s], fences
// the async proxy and refills. Each variant changes one part of that protocol (see Ring) and is
// checked against a CPU reference, so a stage refilled too early fails the test even when the
// sanitizer is not running. scripts/gpu_racecheck.sh runs racecheck on each variant alone.
#include <cuda.h>  // CUtensorMap (kTensorCopy)
#include <cudaTypedefs.h>
#include <gtest/gtest.h>

#include <cuda/barrier>
#include <cuda/ptx>
#include <random>
#include <string>
#include <vector>

#include "kernels/device.cuh"
#include "tests/kernels/test_util.h"

namespace twinstep::kernels {
namespace {

using namespace detail;  // NOLINT: device primitives of kernels/device.cuh
using test::Bf16Host;
using test::DeviceBuffer;

// Protocol variants. Consumer release: lane 0 after __syncwarp (gemv_kernel before the fix) or
// every consumer thread after its own reads. Producer: lane 0's arrive.expect_tx before the copies
// (gemv_kernel) or lane 0's expect_tx plus an arrive from each lane after issuing its copies.
enum class Ring {
  kLane0Arrive,          // gemv_kernel before the fix: both lane-0 forms
  kAllArrive,            // every consumer thread arrives on empty[s] (gemv_kernel now)
  kArriveAfterIssue,     // full[s] counts the 32 producer lanes, each arriving after its copies
  kAllArriveAfterIssue,  // both of the above
  kLibcuxx,  // cuda::barrier, memcpy_async_tx + barrier_arrive_tx, all threads arrive (CUDA guide)
  kTensorCopy,  // kLane0Arrive with cp.async.bulk.tensor.2d row copies in place of cp.async.bulk
};

const char* ring_name(Ring r) {
  switch (r) {
    case Ring::kLane0Arrive:
      return "Lane0Arrive";
    case Ring::kAllArrive:
      return "AllArrive";
    case Ring::kArriveAfterIssue:
      return "ArriveAfterIssue";
    case Ring::kAllArriveAfterIssue:
      return "AllArriveAfterIssue";
    case Ring::kLibcuxx:
      return "Libcuxx";
    case Ring::kTensorCopy:
      return "TensorCopy";
  }
  return "?";
}

constexpr int kConsumerWarps = 4;
constexpr int kThreads = (kConsumerWarps + 1) * 32;
constexpr int kStages = 4;
constexpr int kKc = 64;                      // k elements per stage: two 32-element mma chunks
constexpr int kXRows = 16;                   // m = 16 activation rows
constexpr int kWRows = kConsumerWarps * 16;  // weight rows per block (one 16-row tile per warp)
constexpr int kStageRows = kXRows + kWRows;
constexpr int kRowBytes = kKc * 2;
constexpr int kBlocks = 8;
constexpr int kK = 2048;  // 32 stages per block: the ring wraps 8 times

using BlockBarrier = cuda::barrier<cuda::thread_scope_block>;

__device__ BlockBarrier* libcuxx_barriers() {
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ BlockBarrier bars[2 * kStages];  // full[0..S), empty[S..2S)
  return bars;
}

// Adds `bytes` of expected transactions to the current phase of `bar` without arriving.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// One row of a 2-D tensor map [rows][k] (box kKc x 1) into shared memory (dst 128-byte aligned).
__device__ __forceinline__ void bulk_tensor_row_g2s(void* dst, const CUtensorMap* map, int k0,
                                                    int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row), "r"(smem_addr(bar))
      : "memory");
}

// y[t][col] = sum_k x[t][k] * w[col][k] for the kWRows rows of this block; stride = bytes per
// shared row (kRowBytes + 16 like gemv_kernel, + 128 for kTensorCopy's 128-byte alignment).
template <Ring kRing>
__global__ void __launch_bounds__(kThreads)
    bulk_ring_kernel(const bf16* w, const bf16* x, float* y, int n, int stride,
                     const __grid_constant__ CUtensorMap w_map,
                     const __grid_constant__ CUtensorMap x_map) {
  constexpr bool kLibcuxx = kRing == Ring::kLibcuxx;
  constexpr bool kConsumerAllArrive =
      kRing == Ring::kAllArrive || kRing == Ring::kAllArriveAfterIssue || kLibcuxx;
  constexpr bool kArriveAfterIssue =
      kRing == Ring::kArriveAfterIssue || kRing == Ring::kAllArriveAfterIssue || kLibcuxx;
  extern __shared__ __align__(128) unsigned char ring_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(ring_smem);
  uint64_t* empty = full + kStages;
  BlockBarrier* bars = nullptr;
  if constexpr (kLibcuxx) bars = libcuxx_barriers();
  const uint32_t after_bars = smem_addr(ring_smem) + 128;
  unsigned char* ring = ring_smem + 128 + (128 - after_bars % 128) % 128;
  const int stage_bytes = kStageRows * stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      if constexpr (kLibcuxx) {
        init(&bars[s], 32);
        init(&bars[kStages + s], kConsumerWarps * 32);
      } else {
        mbar_init(&full[s], kArriveAfterIssue ? 32 : 1);
        mbar_init(&empty[s], kConsumerAllArrive ? kConsumerWarps * 32 : kConsumerWarps);
      }
    }
    if constexpr (kLibcuxx)
      cuda::device::experimental::fence_proxy_async_shared_cta();  // the guide's init fence
    else
      mbar_fence_init();
  }
  __syncthreads();
  constexpr int iterations = kK / kKc;

  if (warp == kConsumerWarps) {
    // ---- producer warp: lane l copies weight rows l, l + 32 and activation row l (< 16) ----
    const int lane_bytes = ((kWRows + 31 - lane) / 32 + (lane < kXRows ? 1 : 0)) * kRowBytes;
    auto copy_row = [&](int s, int slot, bool is_x, int row, int k0) {
      unsigned char* dst = ring + s * stage_bytes + slot * stride;
      const bf16* src = (is_x ? x : w) + static_cast<size_t>(row) * kK + k0;
      if constexpr (kRing == Ring::kTensorCopy)
        bulk_tensor_row_g2s(dst, is_x ? &x_map : &w_map, k0, row, &full[s]);
      else if constexpr (kLibcuxx)
        cuda::device::memcpy_async_tx(reinterpret_cast<char*>(dst),
                                      reinterpret_cast<const char*>(src),
                                      cuda::aligned_size_t<16>(kRowBytes), bars[s]);
      else
        bulk_copy_g2s(dst, src, kRowBytes, &full[s]);
    };
    // Last copies of stage s from this lane, then (arrive-after-issue variants) its arrival.
    auto issue_x_and_publish = [&](int s, int k0) {
      for (int t = lane; t < kXRows; t += 32) copy_row(s, t, true, t, k0);
      if constexpr (kLibcuxx) {
        auto token = cuda::device::barrier_arrive_tx(bars[s], 1, lane_bytes);
        (void)token;
      } else if constexpr (kArriveAfterIssue) {
        mbar_arrive(&full[s]);
      }
    };
    bool issued_x = false;  // gemv: false until the PDL wait; x rows of stages < kStages wait
    int pending_k0[kStages];
    for (int it = 0; it < iterations; ++it) {
      const int s = it % kStages, k0 = it * kKc;
      if (!issued_x && it >= kStages) {
        for (int j = 0; j < kStages; ++j) issue_x_and_publish(j, pending_k0[j]);
        issued_x = true;
      }
      if (it >= kStages) {
        const uint32_t parity = ((it / kStages) - 1) & 1;
        if constexpr (kLibcuxx) {
          bars[kStages + s].wait_parity(parity);
          cuda::device::experimental::fence_proxy_async_shared_cta();
        } else {
          mbar_wait(&empty[s], parity);
          fence_proxy_async_shared();
        }
      }
      if constexpr (!kLibcuxx) {
        if (lane == 0) {
          if constexpr (kArriveAfterIssue)
            mbar_expect_tx(&full[s], kStageRows * kRowBytes);
          else
            mbar_arrive_expect_tx(&full[s], kStageRows * kRowBytes);
        }
        __syncwarp();
      }
      for (int r = lane; r < kWRows; r += 32)
        copy_row(s, kXRows + r, false, blockIdx.x * kWRows + r, k0);
      if (issued_x)
        issue_x_and_publish(s, k0);
      else
        pending_k0[s] = k0;
    }
    if (!issued_x)
      for (int j = 0; j < min(iterations, kStages); ++j) issue_x_and_publish(j, pending_k0[j]);
    return;
  }

  // ---- consumer warps: the fragment layout of gemv_kernel (kM16) ----
  const int gid = lane / 4, tq = lane % 4;
  const uint32_t ring_addr = smem_addr(ring);
  const uint32_t lane_off = (lane % 8) * stride + (lane / 8) * 16;
  float acc[2][4] = {};
  for (int it = 0; it < iterations; ++it) {
    const int s = it % kStages;
    const uint32_t parity = (it / kStages) & 1;
    if constexpr (kLibcuxx)
      bars[s].wait_parity(parity);
    else
      mbar_wait(&full[s], parity);
    const uint32_t st = ring_addr + s * stage_bytes + lane_off;
    const uint32_t wt = st + (kXRows + warp * 16) * stride;
#pragma unroll
    for (int c = 0; c < kKc / 32; ++c) {
      uint32_t xl[4], xh[4], w0[4], w1[4];
      ldmatrix_x4(xl, st + c * 64);
      ldmatrix_x4(xh, st + 8 * stride + c * 64);
      ldmatrix_x4(w0, wt + c * 64);
      ldmatrix_x4(w1, wt + 8 * stride + c * 64);
      mma_16816(acc[0], xl[0], xh[0], xl[1], xh[1], w0[0], w0[1]);
      mma_16816(acc[1], xl[0], xh[0], xl[1], xh[1], w1[0], w1[1]);
      mma_16816(acc[0], xl[2], xh[2], xl[3], xh[3], w0[2], w0[3]);
      mma_16816(acc[1], xl[2], xh[2], xl[3], xh[3], w1[2], w1[3]);
    }
    if constexpr (kLibcuxx) {
      auto token = bars[kStages + s].arrive();
      (void)token;
    } else if constexpr (kConsumerAllArrive) {
      mbar_arrive(&empty[s]);
    } else {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
  }
  // acc[u][2h + j] = token gid + 8h, weight row u * 8 + tq * 2 + j of this warp's tile.
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = blockIdx.x * kWRows + warp * 16 + u * 8 + tq * 2 + j;
        y[static_cast<size_t>(gid + 8 * h) * n + col] = acc[u][2 * h + j];
      }
}

// Row-major [rows][kK] bf16 tensor map with a (kKc x 1) box: one ring row per copy.
CUtensorMap row_tensor_map(const bf16* base, int rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  TS_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled",
                                                 reinterpret_cast<void**>(&encode), 12000,
                                                 cudaEnableDefault, &found));
  EXPECT_EQ(found, cudaDriverEntryPointSuccess);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kK), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kK) * 2};
  const cuuint32_t box[2] = {kKc, 1};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EXPECT_EQ(r, CUDA_SUCCESS) << "cuTensorMapEncodeTiled";
  return map;
}

template <Ring kRing>
void run_ring(const bf16* w, const bf16* x, float* y, int n) {
  const int stride = kRowBytes + (kRing == Ring::kTensorCopy ? 128 : 16);
  const int smem = 256 + kStages * kStageRows * stride;  // barriers + alignment slack + ring
  auto kernel = bulk_ring_kernel<kRing>;
  TS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CUtensorMap w_map{}, x_map{};
  if constexpr (kRing == Ring::kTensorCopy) {
    w_map = row_tensor_map(w, n);
    x_map = row_tensor_map(x, kXRows);
  }
  launch(kernel, dim3(kBlocks), dim3(kThreads), smem, nullptr, false, w, x, y, n, stride, w_map,
         x_map);
}

void run_ring(Ring r, const bf16* w, const bf16* x, float* y, int n) {
  switch (r) {
    case Ring::kLane0Arrive:
      return run_ring<Ring::kLane0Arrive>(w, x, y, n);
    case Ring::kAllArrive:
      return run_ring<Ring::kAllArrive>(w, x, y, n);
    case Ring::kArriveAfterIssue:
      return run_ring<Ring::kArriveAfterIssue>(w, x, y, n);
    case Ring::kAllArriveAfterIssue:
      return run_ring<Ring::kAllArriveAfterIssue>(w, x, y, n);
    case Ring::kLibcuxx:
      return run_ring<Ring::kLibcuxx>(w, x, y, n);
    case Ring::kTensorCopy:
      return run_ring<Ring::kTensorCopy>(w, x, y, n);
  }
}

class BulkRingRace : public ::testing::TestWithParam<Ring> {};

TEST_P(BulkRingRace, MatchesCpuReference) {
  TS_SKIP_WITHOUT_GPU();
  int major = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9) GTEST_SKIP() << "cp.async.bulk needs sm_90";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int n = kBlocks * kWRows;
  const Bf16Host w = test::random_bf16(static_cast<size_t>(n) * kK, rng);
  const Bf16Host x = test::random_bf16(static_cast<size_t>(kXRows) * kK, rng);
  auto dw = test::to_device(w);
  auto dx = test::to_device(x);
  DeviceBuffer<float> y(static_cast<size_t>(kXRows) * n);
  std::vector<double> ref(static_cast<size_t>(kXRows) * n);
  for (int t = 0; t < kXRows; ++t)
    for (int c = 0; c < n; ++c) {
      double acc = 0;
      for (int i = 0; i < kK; ++i)
        acc += static_cast<double>(w.values[static_cast<size_t>(c) * kK + i]) *
               x.values[static_cast<size_t>(t) * kK + i];
      ref[static_cast<size_t>(t) * n + c] = acc;
    }
  for (int launch_index = 0; launch_index < 3; ++launch_index) {
    y.poison();
    run_ring(GetParam(), dw.get(), dx.get(), y.get(), n);
    // fp32 accumulation of exact bf16 products: a stale or half-written stage is far above this.
    EXPECT_LT(test::rel_error(y.download(), ref), 1e-4) << "launch " << launch_index;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, BulkRingRace,
                         ::testing::Values(Ring::kLane0Arrive, Ring::kAllArrive,
                                           Ring::kArriveAfterIssue, Ring::kAllArriveAfterIssue,
                                           Ring::kLibcuxx, Ring::kTensorCopy),
                         [](const ::testing::TestParamInfo<Ring>& info) {
                           return std::string(ring_name(info.param));
                         });

}  // namespace
}  // namespace twinstep::kernels
