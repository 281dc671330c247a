#include <cuda/atomic>

#include <algorithm>
#include <string>

#include "kernels/device.cuh"
#include "kernels/gemv_chain.h"

namespace twinstep::kernels {

namespace {

constexpr int kThreads = 256, kWarps = 8;
constexpr int kBatchK = 64;  // k elements of one warp batch (16 rows x 64 = 2 KB of weights)
constexpr int kPieces = 4;   // 16-byte pieces per thread per batch
constexpr int kKAlign = kWarps * kBatchK;                       // 512
constexpr size_t kSlotBytes = size_t{kPieces} * kThreads * 16;  // 16 KB per ring slot
constexpr size_t kMinSmemBytes = 120 * 1024;  // > half an SM: one block per SM, never two
constexpr int kXPad = 8;                      // bf16 elements after each staged row (banks)

struct ChainParams {
  GemvChainStage stage[kGemvChainMaxStages];
  int tiles[kGemvChainMaxStages];  // 16-row tiles (SwiGLU: 8 gate + 8 up rows) per stage
  int num_stages, m;
  float eps;
  unsigned long long* counter;
  unsigned long long* trace;  // benchmark only (GemvChain::trace)
};

// Shared memory: the ring [ring][kPieces][kThreads] of 16-byte pieces, the stage's input rows
// [m][k + kXPad] bf16, 16 zero bytes (the padding rows' A fragments), then the warps' row sums
// [2][kWarps][m][16] (double buffered: one barrier per tile), the rms partials [m][kWarps] and
// inv_rms [m].
__host__ __device__ constexpr size_t x_offset(int ring) { return ring * kSlotBytes; }
__host__ __device__ constexpr size_t zero_offset(int ring, int m, int k_max) {
  return x_offset(ring) + size_t{2} * m * (k_max + kXPad);
}
__host__ __device__ constexpr size_t red_offset(int ring, int m, int k_max) {
  return zero_offset(ring, m, k_max) + 16;
}
__host__ __device__ constexpr size_t smem_bytes(int m, int ring, int k_max) {
  return red_offset(ring, m, k_max) + sizeof(float) * (2 * kWarps * m * 16 + m * kWarps + m);
}

__device__ __forceinline__ int block_tiles(const ChainParams& p, int s) {
  const int left = p.tiles[s] - static_cast<int>(blockIdx.x);
  return left > 0 ? (left + static_cast<int>(gridDim.x) - 1) / static_cast<int>(gridDim.x) : 0;
}
__device__ __forceinline__ int stage_batches(const ChainParams& p, int s) {
  return p.stage[s].k / kKAlign;
}

// Weight row of tile row r (0..15): 16 consecutive rows, or for SwiGLU 8 gate rows and the 8
// matching up rows (n further on).
__device__ __forceinline__ int weight_row(const GemvChainStage& st, int tile, int r) {
  if (st.epilogue == GemvChainEpilogue::kSwigluNormed)
    return r < 8 ? 8 * tile + r : st.n + 8 * tile + r - 8;
  return 16 * tile + r;
}

// This thread's copy stream: stage s, the block's j-th tile of it (tile blockIdx.x + j gridDim.x),
// batch b of the warp's k piece (s == num_stages past the end). Lane l copies tile rows
// (l >> 3) + 4 i (i < kPieces), 16-byte chunk c = l & 7 of each 64-element batch: a warp
// instruction reads four whole 128-byte row segments and writes them whole into shared memory
// (the warp's 2 KB of the slot, row r at 16-byte unit 8 r), chunk c at unit c ^ (r % 8) so that
// the 8 rows of one chunk, an ldmatrix 8x8 matrix, lie in 8 different bank groups. (Rows
// scattered by chunk instead, or 32-byte pieces, left the copies uncoalesced: 2x slower.)
__device__ __forceinline__ int ring_unit(int slot, int warp, int r, int c) {
  return slot * kPieces * kThreads + warp * 128 + r * 8 + (c ^ (r & 7));
}

struct Producer {
  int s = 0, j = 0, b = 0, batches = 0;
  const bf16* src[kPieces] = {};  // this lane's pieces of the current batch

  __device__ __forceinline__ void enter(const ChainParams& p) {
    while (s < p.num_stages && j >= block_tiles(p, s)) {
      ++s;
      j = 0;
    }
    b = 0;
    if (s == p.num_stages) return;
    const GemvChainStage& st = p.stage[s];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int tile = static_cast<int>(blockIdx.x) + j * static_cast<int>(gridDim.x);
    batches = stage_batches(p, s);
#pragma unroll
    for (int i = 0; i < kPieces; ++i)
      src[i] = st.w + static_cast<size_t>(weight_row(st, tile, (lane >> 3) + 4 * i)) * st.k +
               warp * (st.k / kWarps) + (lane & 7) * 8;
  }
  __device__ __forceinline__ void issue(const ChainParams& p, uint4* ring, int slot) {
    if (s == p.num_stages) return;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      detail::cp_async_16(ring + ring_unit(slot, threadIdx.x / 32, (lane >> 3) + 4 * i, lane & 7),
                          src[i], 16);
      src[i] += kBatchK;
    }
    if (++b == batches) {
      ++j;
      enter(p);
    }
  }
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Grid-wide barrier over a counter that only grows: every block arrives once per barrier, so the
// arrivals come in generations of gridDim.x and a block waits for the end of its own generation.
// Writes before it (this block's outputs) are visible to every block after it.
__device__ __forceinline__ void grid_barrier(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> c(*counter);
    __threadfence();
    const unsigned long long g = gridDim.x;
    const unsigned long long target = (c.fetch_add(1, cuda::memory_order_acq_rel) / g + 1) * g;
    while (c.load(cuda::memory_order_acquire) < target) {
    }
  }
  __syncthreads();
}

// Benchmark trace (GemvChain::trace): per stage and block, thread 0's global timer when the block
// arrived at the stage's barrier (stage 0: before the dependency wait), when it passed it, when
// its input rows were staged, and its SM.
__device__ __forceinline__ void trace_mark(const ChainParams& p, int s, int word) {
  if (p.trace != nullptr && threadIdx.x == 0)
    p.trace[(static_cast<size_t>(s) * gridDim.x + blockIdx.x) * kGemvChainTraceWords + word] =
        word == 3 ? detail::sm_id() : detail::global_timer_ns();
}

// The FMA consumer (GemvChain::fma_consumer; the first form of round 27): each thread reads back
// its own pieces (rows (l >> 3) + 4 i, 8 columns of each batch) and sums them with fp32 FMAs;
// the 8 lanes of a row by xor butterfly, then red_buf[warp][r][row] for the warps' ordered sum.
template <int kM, int kS>
__device__ __forceinline__ void fma_tile(const ChainParams& p, Producer& prod, uint4* ring,
                                         const bf16* xs, int x_stride, int batches, int& slot,
                                         int& prod_slot, float* red_buf) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int k = x_stride - kXPad;
  const int x_base = warp * (k / kWarps) + (lane & 7) * 8;
  float acc[kM][kPieces] = {};
  for (int b = 0; b < batches; ++b) {
    detail::cp_async_wait<kS - 2>();
    prod.issue(p, ring, prod_slot);
    detail::cp_async_commit();
    prod_slot = prod_slot + 1 == kS ? 0 : prod_slot + 1;
    float xf[kM][8];
#pragma unroll
    for (int r = 0; r < kM; ++r) {
      const uint4 v = *reinterpret_cast<const uint4*>(xs + r * x_stride + x_base + b * kBatchK);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        xf[r][2 * e] = __uint_as_float(u[e] << 16);
        xf[r][2 * e + 1] = __uint_as_float(u[e] & 0xffff0000u);
      }
    }
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const uint4 v = ring[ring_unit(slot, warp, (lane >> 3) + 4 * i, lane & 7)];
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float lo = __uint_as_float(u[e] << 16), hi = __uint_as_float(u[e] & 0xffff0000u);
#pragma unroll
        for (int r = 0; r < kM; ++r) {
          acc[r][i] = fmaf(lo, xf[r][2 * e], acc[r][i]);
          acc[r][i] = fmaf(hi, xf[r][2 * e + 1], acc[r][i]);
        }
      }
    }
    slot = slot + 1 == kS ? 0 : slot + 1;
  }
#pragma unroll
  for (int r = 0; r < kM; ++r)
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      float v = acc[r][i];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      if ((lane & 7) == 0) red_buf[(warp * kM + r) * 16 + (lane >> 3) + 4 * i] = v;
    }
}

template <int kM, int kS, bool kMma>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_chain_kernel(const __grid_constant__ ChainParams p, int k_max) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
  bf16* xs = reinterpret_cast<bf16*>(smem + x_offset(kS));
  uint4* zero16 = reinterpret_cast<uint4*>(smem + zero_offset(kS, kM, k_max));
  float* red = reinterpret_cast<float*>(smem + red_offset(kS, kM, k_max));  // [2][kWarps][kM][16]
  float* rms_part = red + 2 * kWarps * kM * 16;                             // [kM][kWarps]
  float* inv_rms = rms_part + kM * kWarps;                                  // [kM]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) *zero16 = make_uint4(0, 0, 0, 0);

  // Prologue: kS - 1 batches of weights (no activation) before the dependency wait.
  Producer prod;
  prod.enter(p);
  for (int i = 0; i < kS - 1; ++i) {
    prod.issue(p, ring, i);
    detail::cp_async_commit();
  }
  int prod_slot = kS - 1, slot = 0, buf = 0;
  trace_mark(p, 0, 0);
  trace_mark(p, 0, 3);
  detail::pdl_wait_and_trigger();

  for (int s = 0; s < p.num_stages; ++s) {
    if (s > 0) {
      trace_mark(p, s, 0);
      grid_barrier(p.counter);
    }
    trace_mark(p, s, 1);
    const GemvChainStage& st = p.stage[s];
    const int tiles = block_tiles(p, s);
    if (tiles == 0) continue;
    const bool normed = st.epilogue != GemvChainEpilogue::kResidual;
    const int x_stride = st.k + kXPad;

    // The stage's input rows into shared memory (L2 reads: written by other blocks in this launch
    // or by the preceding kernel), and inv_rms from them in a fixed order.
    const int chunks = st.k / 8;  // 16-byte chunks per row: at most 8 per thread (k <= 16384)
    for (int r = 0; r < kM; ++r) {
      const uint4* src = reinterpret_cast<const uint4*>(st.x + static_cast<size_t>(r) * st.k);
      uint4* dst = reinterpret_cast<uint4*>(xs + r * x_stride);
      uint4 v[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int c = static_cast<int>(threadIdx.x) + q * kThreads;
        v[q] = r < p.m && c < chunks ? __ldcg(src + c) : make_uint4(0, 0, 0, 0);
      }
      float sq = 0.0f;  // padding rows: zeros, their sums computed and never stored
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const int c = static_cast<int>(threadIdx.x) + q * kThreads;
        if (c < chunks) {
          dst[c] = v[q];
          const uint32_t u[4] = {v[q].x, v[q].y, v[q].z, v[q].w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float lo = __uint_as_float(u[e] << 16), hi = __uint_as_float(u[e] & 0xffff0000u);
            sq = fmaf(lo, lo, sq);
            sq = fmaf(hi, hi, sq);
          }
        }
      }
      if (normed) {
#pragma unroll
        for (int off = 16; off > 0; off /= 2) sq += __shfl_xor_sync(0xffffffffu, sq, off);
        if (lane == 0) rms_part[r * kWarps + warp] = sq;
      }
    }
    __syncthreads();
    if (normed && threadIdx.x < kM) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += rms_part[threadIdx.x * kWarps + w];
      inv_rms[threadIdx.x] = rsqrtf(sum / static_cast<float>(st.k) + p.eps);
    }
    __syncthreads();
    trace_mark(p, s, 2);

    // A fragments (activation rows x k16, rows >= m zero): lane L gives row L % 8 of matrix L / 8
    // (rows 0-7 at k 0-7, rows 8-15 at k 0-7, rows 0-7 at k 8-15, rows 8-15 at k 8-15).
    const int a_row = (lane / 8) % 2 * 8 + lane % 8;
    const uint32_t a_base =
        a_row < p.m ? smem_u32(xs + a_row * x_stride + warp * (st.k / kWarps) + lane / 16 * 8)
                    : smem_u32(zero16);
    const uint32_t a_step = a_row < p.m ? 2u : 0u;  // bytes per k element (0: the zero slot)
    // B fragments of k step i: lane L gives row L % 8 of matrix L / 8 = (rows 0-7, chunk 2 i),
    // (rows 0-7, chunk 2 i + 1), (rows 8-15, chunk 2 i), (rows 8-15, chunk 2 i + 1).
    const int b_row = lane / 16 * 8 + lane % 8, b_half = lane / 8 % 2;
    const int batches = stage_batches(p, s);
    for (int j = 0; j < tiles; ++j) {
      float* red_buf = red + buf * kWarps * kM * 16;
      if constexpr (!kMma) {
        fma_tile<kM, kS>(p, prod, ring, xs, x_stride, batches, slot, prod_slot, red_buf);
      } else {
        // One accumulator per (piece, n8 unit): no mma waits for another within a batch; summed
        // in piece order at the tile's end.
        float d[kPieces][2][4] = {};
        for (int b = 0; b < batches; ++b) {
          detail::cp_async_wait<kS - 2>();  // this thread's copies of batch `slot` have landed
          __syncwarp();                     // ... and every lane's, for the warp's ldmatrix
          prod.issue(p, ring, prod_slot);
          detail::cp_async_commit();
          prod_slot = prod_slot + 1 == kS ? 0 : prod_slot + 1;
          uint32_t a[kPieces][4], w[kPieces][4];
#pragma unroll
          for (int i = 0; i < kPieces; ++i) {
            detail::ldmatrix_x4(a[i],
                                a_base + a_step * static_cast<uint32_t>(b * kBatchK + 16 * i));
            detail::ldmatrix_x4(w[i],
                                smem_u32(ring + ring_unit(slot, warp, b_row, 2 * i + b_half)));
          }
#pragma unroll
          for (int i = 0; i < kPieces; ++i) {
            detail::mma_16816(d[i][0], a[i][0], a[i][1], a[i][2], a[i][3], w[i][0], w[i][1]);
            detail::mma_16816(d[i][1], a[i][0], a[i][1], a[i][2], a[i][3], w[i][2], w[i][3]);
          }
          slot = slot + 1 == kS ? 0 : slot + 1;  // refilled after the next __syncwarp: all read
        }
#pragma unroll
        for (int i = 1; i < kPieces; ++i)
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) d[0][u][e] += d[i][u][e];

        // D: lane l holds activation row l / 4 (and l / 4 + 8, zero), tile rows 8 u + 2 (l % 4)
        // and + 1; the warps' sums in order.
        if (lane / 4 < kM) {
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            red_buf[(warp * kM + lane / 4) * 16 + 8 * u + 2 * (lane % 4)] = d[0][u][0];
            red_buf[(warp * kM + lane / 4) * 16 + 8 * u + 2 * (lane % 4) + 1] = d[0][u][1];
          }
        }
      }
      __syncthreads();
      const int tile = static_cast<int>(blockIdx.x) + j * static_cast<int>(gridDim.x);
      auto row_sum = [&](int r, int row) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) sum += red_buf[(w * kM + r) * 16 + row];
        return sum;
      };
      if (st.epilogue == GemvChainEpilogue::kSwigluNormed) {
        if (threadIdx.x < 8 * kM) {
          const int r = threadIdx.x / 8, row = threadIdx.x % 8;
          if (r < p.m) {
            const float g = inv_rms[r] * row_sum(r, row), u = inv_rms[r] * row_sum(r, row + 8);
            st.out[static_cast<size_t>(r) * st.n + 8 * tile + row] =
                __float2bfloat16(g / (1.0f + __expf(-g)) * u);
          }
        }
      } else if (threadIdx.x < 16 * kM) {
        const int r = threadIdx.x / 16, row = threadIdx.x % 16;
        if (r < p.m) {
          bf16* dst = st.out + static_cast<size_t>(r) * st.n + 16 * tile + row;
          const float sum = row_sum(r, row);
          if (st.epilogue == GemvChainEpilogue::kNormed) {
            *dst = __float2bfloat16(inv_rms[r] * sum);
          } else {
            const float old = __bfloat162float(__ldcg(dst));
            *dst = __float2bfloat16(old + __bfloat162float(__float2bfloat16(sum)));
          }
        }
      }
      buf ^= 1;
    }
  }
  detail::cp_async_wait<0>();
}

template <int kM, int kS, bool kMma>
void launch_chain(const ChainParams& params, int k_max, cudaStream_t stream, bool pdl) {
  const size_t bytes = std::max(smem_bytes(kM, kS, k_max), kMinSmemBytes);
  auto kernel = gemv_chain_kernel<kM, kS, kMma>;
  int device = 0, sms = 0, per_sm = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  static const bool configured = [&] {  // the launcher checked bytes against this maximum
    int max_smem = 0;
    TS_CUDA_CHECK(
        cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    TS_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    return true;
  }();
  (void)configured;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, bytes));
  if (per_sm != 1)
    throw_invalid_argument("gemv_chain",
                           "one block per SM expected, the occupancy calculator "
                           "gives " +
                               std::to_string(per_sm));
  detail::launch(kernel, dim3(sms), dim3(kThreads), bytes, stream, pdl, params, k_max);
}

template <int kM, bool kMma>
void dispatch_ring(const ChainParams& params, int k_max, int ring, cudaStream_t stream, bool pdl) {
  if (ring == 12) return launch_chain<kM, 12, kMma>(params, k_max, stream, pdl);
  if (ring == 8) return launch_chain<kM, 8, kMma>(params, k_max, stream, pdl);
  launch_chain<kM, 6, kMma>(params, k_max, stream, pdl);
}

template <int kM>
void dispatch_consumer(const ChainParams& params, int k_max, int ring, bool fma,
                       cudaStream_t stream, bool pdl) {
  if (fma) return dispatch_ring<kM, false>(params, k_max, ring, stream, pdl);
  dispatch_ring<kM, true>(params, k_max, ring, stream, pdl);
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

}  // namespace

size_t gemv_chain_workspace_bytes() { return 256; }

void gemv_chain_workspace_init(void* workspace, cudaStream_t stream) {
  TS_REQUIRE(workspace != nullptr, "workspace is null");
  TS_CUDA_CHECK(cudaMemsetAsync(workspace, 0, gemv_chain_workspace_bytes(), stream));
}

bool gemv_chain_ring_fits(int m, int ring_stages, int k_max) {
  int device = 0, max_smem = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return smem_bytes(m, ring_stages, k_max) <= static_cast<size_t>(max_smem);
}

void gemv_chain(const GemvChain& chain, void* workspace, cudaStream_t stream, bool pdl,
                int ring_stages) {
  TS_REQUIRE(chain.num_stages >= 1 && chain.num_stages <= kGemvChainMaxStages,
             "num_stages " + std::to_string(chain.num_stages) + " outside [1, 8]");
  TS_REQUIRE(chain.m >= 1 && chain.m <= kGemvChainMaxRows,
             "m " + std::to_string(chain.m) + " outside [1, 4]");
  TS_REQUIRE(chain.eps > 0.0f, "eps must be positive");
  TS_REQUIRE(workspace != nullptr, "workspace is null");
  ChainParams params{};
  int k_max = 0;
  for (int s = 0; s < chain.num_stages; ++s) {
    const GemvChainStage& st = chain.stage[s];
    const std::string at = "stage " + std::to_string(s) + ": ";
    TS_REQUIRE(st.w != nullptr && st.x != nullptr && st.out != nullptr, at + "null pointer");
    TS_REQUIRE(st.k > 0 && st.k % kKAlign == 0 && st.k <= kGemvChainMaxK,
               at + "k " + std::to_string(st.k) + " is not a positive multiple of 512 up to " +
                   std::to_string(kGemvChainMaxK));
    const bool swiglu = st.epilogue == GemvChainEpilogue::kSwigluNormed;
    TS_REQUIRE(st.epilogue == GemvChainEpilogue::kResidual ||
                   st.epilogue == GemvChainEpilogue::kNormed || swiglu,
               at + "unknown epilogue");
    TS_REQUIRE(st.n > 0 && st.n % (swiglu ? 8 : 16) == 0, at + "n " + std::to_string(st.n) +
                                                              " is not a positive multiple of " +
                                                              (swiglu ? "8" : "16"));
    TS_REQUIRE(
        reinterpret_cast<uintptr_t>(st.w) % 16 == 0 && reinterpret_cast<uintptr_t>(st.x) % 16 == 0,
        at + "w and x must be 16-byte aligned");
    const size_t w_bytes = size_t{2} * (swiglu ? 2 : 1) * st.n * st.k;
    const size_t x_bytes = size_t{2} * chain.m * st.k, out_bytes = size_t{2} * chain.m * st.n;
    TS_REQUIRE(
        !overlaps(st.out, out_bytes, st.x, x_bytes) && !overlaps(st.out, out_bytes, st.w, w_bytes),
        at + "out overlaps the stage's x or w");
    params.stage[s] = st;
    params.tiles[s] = swiglu ? st.n / 8 : st.n / 16;
    k_max = std::max(k_max, st.k);
  }
  params.num_stages = chain.num_stages;
  params.m = chain.m;
  params.eps = chain.eps;
  params.counter = static_cast<unsigned long long*>(workspace);
  params.trace = chain.trace;

  int device = 0, max_smem = 0;
  TS_CUDA_CHECK(cudaGetDevice(&device));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  int ring = ring_stages;
  if (ring == 0) {
    for (int candidate : {12, 8, 6})
      if (smem_bytes(chain.m, candidate, k_max) <= static_cast<size_t>(max_smem)) {
        ring = candidate;
        break;
      }
    TS_REQUIRE(ring != 0, "m " + std::to_string(chain.m) + " rows of k " + std::to_string(k_max) +
                              " leave no room for a 6-slot ring in " + std::to_string(max_smem) +
                              " bytes of shared memory");
  }
  TS_REQUIRE(ring == 6 || ring == 8 || ring == 12,
             "ring_stages " + std::to_string(ring_stages) + " is not 0, 6, 8 or 12");
  TS_REQUIRE(smem_bytes(chain.m, ring, k_max) <= static_cast<size_t>(max_smem),
             "a ring of " + std::to_string(ring) + " slots beside " + std::to_string(chain.m) +
                 " rows of k " + std::to_string(k_max) + " does not fit in shared memory");
  switch (chain.m) {
    case 1:
      return dispatch_consumer<1>(params, k_max, ring, chain.fma_consumer, stream, pdl);
    case 2:
      return dispatch_consumer<2>(params, k_max, ring, chain.fma_consumer, stream, pdl);
    case 3:
      return dispatch_consumer<3>(params, k_max, ring, chain.fma_consumer, stream, pdl);
    default:
      return dispatch_consumer<4>(params, k_max, ring, chain.fma_consumer, stream, pdl);
  }
}

}  // namespace twinstep::kernels
