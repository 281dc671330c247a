// Bandwidth benchmark for kernels/: each figure beside the floor it is judged against, all
// measured in this one process on this GPU.
//
//   twinstep_kernels_bench --out results.json [--commit SHA] [--only SECTION ...]
//
// SECTION: gemv, gemv_split, access, l2_prefetch, attention, attention_kv_heads,
// attention_batch, layer_chain, moe, lm_head (default: all; the floor always runs); by name only:
// attention_trace (per-block timelines of the attention pair), chain_trigger (the layer chain per
// trigger placement of its small kernels and per combine form), ncu (one untimed launch per
// kernel for Nsight Compute, scripts/gpu_ncu.sh).
//
// Floor: the best streaming-read bandwidth of our own read kernel over a 4 GiB buffer.
// Cold: every launch in a timed graph reads a different copy of the weights (or KV layer), the
// copies together >= 1.5 GiB, far beyond the 60 MB L2. Warm: the same copy every launch.
// Times: a captured graph of many launches, replayed; median of replays / launches per graph.
// cuBLAS: cublasGemmEx bf16 in/out, fp32 compute, captured and timed the same way.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "kernels/device.cuh"
#include "kernels/gemv.h"
#include "kernels/gemv_norm.h"
#include "kernels/gemv_split.h"
#include "kernels/lm_head.h"
#include "kernels/moe.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "kernels/tuning.h"

using namespace twinstep::kernels;

#define CUBLAS_CHECK(expr)                                                             \
  do {                                                                                 \
    cublasStatus_t s_ = (expr);                                                        \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
      std::fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, \
                   static_cast<int>(s_));                                              \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

constexpr size_t kColdBytes = size_t{3} << 29;  // 1.5 GiB of distinct copies at least

// ---------------------------------------------------------------------------------------------
// helper kernels

__global__ void fill_random_kernel(bf16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t r = philox_u32(seed, i >> 32, 0, static_cast<uint32_t>(i));
    float v = (static_cast<float>(r >> 8) * 0x1p-24f * 2.0f - 1.0f) * scale;
    if (v == 0.0f) v = scale * 0.5f;
    p[i] = __float2bfloat16(v);
  }
}

// 16-byte loads and copies of weights, spelled out here (not kernels/device.cuh's, whose L2 hint
// is a build option) so that every build measures both: kL2Line = the .L2::128B prefetch size.
template <bool kL2Line>
__device__ __forceinline__ uint4 ld_weight_16(const void* ptr) {
  uint4 v;
  if constexpr (kL2Line)
    asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
  else
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
  return v;
}
template <bool kL2Line>
__device__ __forceinline__ void cp_weight_16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  if constexpr (kL2Line)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}

// Streaming read: each thread keeps kUnroll independent 16-byte loads in flight. kPdl: the
// kernel as the first of a PDL pair would run it: it lets its dependent launch at once and reads
// everything before its dependency wait (nothing it reads is written by the kernel before it),
// so consecutive launches overlap as far as the SMs' resources allow (the attention section's
// ceiling for a streaming kernel of one layer's size).
template <int kUnroll, bool kL2Line, bool kPdl = false>
__global__ void stream_read_kernel(const uint4* p, size_t n, unsigned* sink) {
  if constexpr (kPdl) cudaTriggerProgrammaticLaunchCompletion();
  uint32_t acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = ld_weight_16<kL2Line>(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = ld_weight_16<kL2Line>(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if constexpr (kPdl) cudaGridDependencySynchronize();
  if (acc == 0x9E3779B9u) sink[0] = acc;  // keeps the loads alive
}

// Weight access patterns (section "access"): a matrix of 8 KB rows (k = 4096) read in 16-row
// tiles by 2 blocks of 8 warps per SM, block b taking tiles b, b + grid, ...; warp w reads its
// 512-element K piece of the tile in 4 steps of 8 instructions, kDepth steps in flight. kPattern 0
// is the GEMV's (gemv_split_kernel): lane (g, t) reads rows g and g + 8, 16 bytes at column
// chunk * 32 + t * 8, so one instruction covers 64 bytes of 8 rows; kPattern 1 reads the same
// bytes as 2 rows x 256 contiguous bytes per instruction. Loads into registers (kAsync false)
// or cp.async into a private shared-memory ring (kAsync, as the GEMV's ring of 3).
constexpr int kAccessK = 4096;
template <int kPattern>
__device__ __forceinline__ const bf16* access_addr(const bf16* w, int tile, int warp, int step,
                                                   int j, int lane) {
  int row, col;
  if constexpr (kPattern == 0) {
    row = tile * 16 + lane / 4 + 8 * (j % 2);
    col = warp * 512 + step * 128 + (j / 2) * 32 + (lane % 4) * 8;
  } else {
    row = tile * 16 + 2 * j + lane / 16;
    col = warp * 512 + step * 128 + (lane % 16) * 8;
  }
  return w + static_cast<size_t>(row) * kAccessK + col;
}
template <int kPattern, bool kAsync, bool kL2Line, int kDepth>
__global__ void __launch_bounds__(256, 2) access_kernel(const bf16* w, int tiles, unsigned* sink) {
  extern __shared__ uint4 access_ring[];  // kAsync: [kDepth][8][256]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int my_tiles = (tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x;
  const int steps = my_tiles * 4;
  unsigned acc = 0;
  auto src = [&](int q, int j) {
    return access_addr<kPattern>(w, blockIdx.x + (q / 4) * gridDim.x, warp, q % 4, j, lane);
  };
  if constexpr (kAsync) {
    auto issue = [&](int q, int slot) {
      if (q < steps)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          cp_weight_16<kL2Line>(&access_ring[(slot * 8 + j) * 256 + threadIdx.x], src(q, j));
      detail::cp_async_commit();
    };
    for (int d = 0; d < kDepth - 1; ++d) issue(d, d);
    int slot = 0;
    for (int q = 0; q < steps; ++q) {
      detail::cp_async_wait<kDepth - 2>();
      issue(q + kDepth - 1, slot == 0 ? kDepth - 1 : slot - 1);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint4 v = access_ring[(slot * 8 + j) * 256 + threadIdx.x];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      slot = slot + 1 == kDepth ? 0 : slot + 1;
    }
    detail::cp_async_wait<0>();
  } else {
    uint4 buf[kDepth][8];
    auto issue = [&](int q, uint4(&b)[8]) {
      if (q < steps)
#pragma unroll
        for (int j = 0; j < 8; ++j) b[j] = ld_weight_16<kL2Line>(src(q, j));
    };
#pragma unroll
    for (int d = 0; d < kDepth - 1; ++d) issue(d, buf[d]);
    for (int q = 0; q < steps; q += kDepth) {
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        issue(q + d + kDepth - 1, buf[(d + kDepth - 1) % kDepth]);
        if (q + d < steps)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc ^= buf[d][j].x ^ buf[d][j].y ^ buf[d][j].z ^ buf[d][j].w;
      }
    }
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

void fill_random(bf16* p, size_t n, uint64_t seed, float scale) {
  fill_random_kernel<<<4096, 256>>>(p, n, seed, scale);
  TS_CUDA_CHECK(cudaGetLastError());
}

bf16* alloc_bf16(size_t n, uint64_t seed, float scale) {
  bf16* p = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&p, n * sizeof(bf16)));
  fill_random(p, n, seed, scale);
  return p;
}

cudaStream_t g_stream;

// Captures body(stream) once, replays it, returns the median replay time in microseconds.
double time_graph_us(const std::function<void(cudaStream_t)>& body, int replays = 9) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TS_CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeGlobal));
  body(g_stream);
  TS_CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
  TS_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  TS_CUDA_CHECK(cudaEventCreate(&start));
  TS_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) TS_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
  std::vector<double> times;
  for (int i = 0; i < replays; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(start, g_stream));
    TS_CUDA_CHECK(cudaGraphLaunch(exec, g_stream));
    TS_CUDA_CHECK(cudaEventRecord(stop, g_stream));
    TS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e3);
  }
  TS_CUDA_CHECK(cudaEventDestroy(start));
  TS_CUDA_CHECK(cudaEventDestroy(stop));
  TS_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TS_CUDA_CHECK(cudaGraphDestroy(graph));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Eager launches (no graph), each timed alone with events: what one isolated call costs.
double time_single_us(const std::function<void(cudaStream_t, int)>& body, int count) {
  cudaEvent_t start, stop;
  TS_CUDA_CHECK(cudaEventCreate(&start));
  TS_CUDA_CHECK(cudaEventCreate(&stop));
  body(g_stream, 0);
  TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
  std::vector<double> times;
  for (int i = 0; i < count; ++i) {
    TS_CUDA_CHECK(cudaEventRecord(start, g_stream));
    body(g_stream, i);
    TS_CUDA_CHECK(cudaEventRecord(stop, g_stream));
    TS_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e3);
  }
  TS_CUDA_CHECK(cudaEventDestroy(start));
  TS_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One JSON row: keys carry units.
struct Row {
  std::vector<std::pair<std::string, std::string>> fields;
  Row& s(const std::string& k, const std::string& v) {
    fields.emplace_back(k, "\"" + v + "\"");
    return *this;
  }
  Row& n(const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    fields.emplace_back(k, buf);
    return *this;
  }
  Row& b(const std::string& k, bool v) {
    fields.emplace_back(k, v ? "true" : "false");
    return *this;
  }
  std::string json() const {
    std::string out = "{";
    for (size_t i = 0; i < fields.size(); ++i)
      out += (i ? ", \"" : "\"") + fields[i].first + "\": " + fields[i].second;
    return out + "}";
  }
};
std::vector<Row> g_rows;
double g_floor_tbps = 0;

void add_row(Row row, double bytes, double time_us) {
  const double tbps = bytes / (time_us * 1e-6) / 1e12;
  row.n("bytes", bytes)
      .n("time_us", time_us)
      .n("tbps", tbps)
      .n("floor_tbps", g_floor_tbps)
      .n("floor_us", bytes / (g_floor_tbps * 1e12) * 1e6)
      .n("pct_of_floor", 100.0 * tbps / g_floor_tbps);
  g_rows.push_back(row);
}

// ---------------------------------------------------------------------------------------------
// sections

double measure_floor() {
  const size_t bytes = size_t{4} << 30;
  uint4* buf = nullptr;
  unsigned* sink = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&buf, bytes));
  TS_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  fill_random(reinterpret_cast<bf16*>(buf), bytes / 2, 7, 1.0f);
  int sms = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double best = 0;
  for (const bool l2_line : {false, true}) {
    for (int blocks_per_sm : {2, 4, 8}) {
      for (int threads : {256, 512, 1024}) {
        if (blocks_per_sm * threads > 2048) continue;
        const double us = time_graph_us(
            [&](cudaStream_t s) {
              const dim3 grid(sms * blocks_per_sm);
              if (l2_line)
                stream_read_kernel<8, true><<<grid, threads, 0, s>>>(buf, bytes / 16, sink);
              else
                stream_read_kernel<8, false><<<grid, threads, 0, s>>>(buf, bytes / 16, sink);
              TS_CUDA_CHECK(cudaGetLastError());
            },
            5);
        const double tbps = bytes / (us * 1e-6) / 1e12;
        std::printf("stream-read%s %d blocks/SM x %d threads: %.1f us, %.3f TB/s\n",
                    l2_line ? " (L2::128B)" : "", blocks_per_sm, threads, us, tbps);
        best = std::max(best, tbps);
      }
    }
  }
  TS_CUDA_CHECK(cudaFree(buf));
  TS_CUDA_CHECK(cudaFree(sink));
  return best;
}

// Section "l2_prefetch": does a prefetch into L2 issued by one kernel serve a later kernel's
// reads? (Round 16 of docs/kernels.md: the next GEMV's first bytes prefetched by the kernel before
// it, withdrawn.) The prefetch forms: a bulk prefetch through the SM's bulk-copy unit, a
// prefetch.global.L2 per 128-byte line, and an ordinary load per line whose value is dropped.
__device__ __forceinline__ void prefetch_l2_bulk(const void* ptr, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(ptr), "r"(bytes) : "memory");
}
__device__ __forceinline__ void prefetch_l2_line(const void* ptr) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(ptr));
}

// Per trial (eager, one stream): a 512 MB read evicts L2, then the prefetch kernel (132 x 256
// threads; "as reader": the read's own launch shape, each line prefetched by the thread that will
// read it) over a region of `bytes`, a 20 us spin, then a streaming read of the region, timed
// alone; beside it the read with no prefetch (cold) and after a full read of the region (warm).
// Median of 9 trials. Results: results/h200/gemv_prefetch_next_2c97d15.json,
// l2_prefetch_f78322a.json. how: 0 bulk prefetches of seg_bytes, 1 prefetch.global.L2 per line, 2
// bulk prefetches with an L2::evict_last cache policy, 3 prefetch.global.L2::evict_last per line, 4
// one 4-byte load per line (.L2::128B: the whole line), 5 one per 256 bytes (.L2::256B), both
// xor-ed into `sink`.
__global__ void l2_prefetch_kernel(const char* p, size_t bytes, uint32_t seg_bytes, int how,
                                   unsigned* sink) {
  const size_t workers = size_t{gridDim.x} * blockDim.x;
  const size_t id = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  uint64_t policy = 0;
  if (how == 2)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  uint32_t acc = 0;
  const uint32_t step = how == 0 || how == 2 ? seg_bytes : how == 5 ? 256 : 128;
  for (size_t off = id * step; off < bytes; off += workers * step) {
    const char* a = p + off;
    if (how == 0) {
      prefetch_l2_bulk(a, static_cast<uint32_t>(min(size_t{seg_bytes}, bytes - off)));
    } else if (how == 1) {
      prefetch_l2_line(a);
    } else if (how == 2) {
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(a),
                   "r"(static_cast<uint32_t>(min(size_t{seg_bytes}, bytes - off))), "l"(policy)
                   : "memory");
    } else if (how == 3) {
      asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(a));
    } else {
      uint32_t v;
      if (how == 4)
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.u32 %0, [%1];\n" : "=r"(v) : "l"(a));
      else
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];\n" : "=r"(v) : "l"(a));
      acc ^= v;
    }
  }
  if (acc == 0x9E3779B9u) sink[0] = acc;
}

// The lines stream_read_kernel<8, ...> with the same launch shape will read, each prefetched by
// the thread that will read it.
__global__ void l2_prefetch_as_reader_kernel(const uint4* p, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += stride)
    if (i % 8 == 0) prefetch_l2_line(p + i);  // the stride is a multiple of 8: one per line
}

__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

void bench_l2_prefetch() {
  const size_t flush_bytes = size_t{512} << 20;
  const size_t region_max = size_t{32} << 20;
  uint4 *flush = nullptr, *region = nullptr;
  unsigned* sink = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  TS_CUDA_CHECK(cudaMalloc(&region, region_max));
  TS_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  TS_CUDA_CHECK(cudaMemset(flush, 1, flush_bytes));
  TS_CUDA_CHECK(cudaMemset(region, 2, region_max));
  int sms = 0, clock_khz = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  cudaEvent_t e[4];
  for (auto& ev : e) TS_CUDA_CHECK(cudaEventCreate(&ev));
  constexpr int kCold = -1, kWarm = -2, kAsReader = -3;
  struct Mode {
    const char* name;
    int how;  // l2_prefetch_kernel's, or kCold, kWarm, kAsReader
    uint32_t seg_bytes;
  };
  for (const size_t bytes : {size_t{8} << 20, size_t{32} << 20})
    for (const Mode mode :
         {Mode{"cold", kCold, 0}, Mode{"warm", kWarm, 0}, Mode{"bulk 256 B", 0, 256},
          Mode{"bulk 4 KB", 0, 4096}, Mode{"bulk 64 KB", 0, 65536}, Mode{"lines", 1, 128},
          Mode{"lines as reader", kAsReader, 128}, Mode{"bulk 256 B evict_last", 2, 256},
          Mode{"lines evict_last", 3, 128}, Mode{"loads 128 B", 4, 128},
          Mode{"loads 256 B", 5, 256}}) {
      std::vector<float> read_us, issue_us;
      for (int trial = 0; trial < 9; ++trial) {
        stream_read_kernel<8, true><<<2 * sms, 512, 0, g_stream>>>(flush, flush_bytes / 16, sink);
        TS_CUDA_CHECK(cudaEventRecord(e[0], g_stream));
        if (mode.how == kWarm)
          stream_read_kernel<8, true><<<2 * sms, 512, 0, g_stream>>>(region, bytes / 16, sink);
        else if (mode.how == kAsReader)
          l2_prefetch_as_reader_kernel<<<2 * sms, 512, 0, g_stream>>>(region, bytes / 16);
        else if (mode.how >= 0)
          l2_prefetch_kernel<<<sms, 256, 0, g_stream>>>(reinterpret_cast<const char*>(region),
                                                        bytes, mode.seg_bytes, mode.how, sink);
        TS_CUDA_CHECK(cudaEventRecord(e[1], g_stream));
        spin_kernel<<<1, 32, 0, g_stream>>>(static_cast<long long>(clock_khz) * 20 / 1000);
        TS_CUDA_CHECK(cudaEventRecord(e[2], g_stream));
        stream_read_kernel<8, true><<<2 * sms, 512, 0, g_stream>>>(region, bytes / 16, sink);
        TS_CUDA_CHECK(cudaEventRecord(e[3], g_stream));
        TS_CUDA_CHECK(cudaGetLastError());
        TS_CUDA_CHECK(cudaEventSynchronize(e[3]));
        float a = 0, b = 0;
        TS_CUDA_CHECK(cudaEventElapsedTime(&a, e[0], e[1]));
        TS_CUDA_CHECK(cudaEventElapsedTime(&b, e[2], e[3]));
        issue_us.push_back(a * 1e3f);
        read_us.push_back(b * 1e3f);
      }
      std::sort(read_us.begin(), read_us.end());
      std::sort(issue_us.begin(), issue_us.end());
      std::printf("l2 prefetch %2zu MB %-21s: prefetch kernel %7.2f us, then read %7.2f us\n",
                  bytes >> 20, mode.name, issue_us[4], read_us[4]);
      Row r;
      r.s("section", "l2_prefetch")
          .s("mode", mode.name)
          .n("region_bytes", static_cast<double>(bytes))
          .n("prefetch_kernel_us", issue_us[4]);
      add_row(r, static_cast<double>(bytes), read_us[4]);
    }
  for (auto& ev : e) TS_CUDA_CHECK(cudaEventDestroy(ev));
  TS_CUDA_CHECK(cudaFree(flush));
  TS_CUDA_CHECK(cudaFree(region));
  TS_CUDA_CHECK(cudaFree(sink));
}

// Section "access": the steady streaming rate of the GEMV's weight access pattern against the
// same bytes read as row runs, by loads and by cp.async, with and without the .L2::128B hint
// (kernels/device.cuh), over 2 GiB of 8 KB rows; each beside the floor.
void bench_access() {
  const size_t bytes = size_t{2} << 30;
  bf16* w = alloc_bf16(bytes / 2, 11, 1.0f);
  unsigned* sink = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
  int sms = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int tiles = static_cast<int>(bytes / (16 * kAccessK * sizeof(bf16)));
  constexpr int kDepth = 3;
  constexpr int kRingBytes = kDepth * 8 * 256 * 16;
  auto run = [&](auto kernel, const char* pattern, const char* load, bool l2_line) {
    TS_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBytes));
    const double us = time_graph_us(
                          [&](cudaStream_t s) {
                            for (int i = 0; i < 3; ++i)
                              kernel<<<2 * sms, 256, kRingBytes, s>>>(w, tiles, sink);
                            TS_CUDA_CHECK(cudaGetLastError());
                          },
                          5) /
                      3;
    Row r;
    r.s("section", "access_pattern")
        .s("pattern", pattern)
        .s("load", load)
        .b("l2_prefetch_128b", l2_line)
        .n("depth_steps", kDepth);
    add_row(r, static_cast<double>(bytes), us);
    std::printf("access %-34s %-12s L2::128B %-3s %8.1f us  %.3f TB/s (%.1f%% of floor)\n", pattern,
                load, l2_line ? "on" : "off", us, bytes / (us * 1e-6) / 1e12,
                100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps);
  };
  const char* frag = "gemv fragments (8 rows x 64 B)";
  const char* rows = "row runs (2 rows x 256 B)";
  for (int rep = 0; rep < 2; ++rep) {
    run(access_kernel<0, true, false, kDepth>, frag, "cp.async.cg", false);
    run(access_kernel<0, true, true, kDepth>, frag, "cp.async.cg", true);
    run(access_kernel<0, false, false, kDepth>, frag, "ld.nc", false);
    run(access_kernel<0, false, true, kDepth>, frag, "ld.nc", true);
    run(access_kernel<1, true, false, kDepth>, rows, "cp.async.cg", false);
    run(access_kernel<1, true, true, kDepth>, rows, "cp.async.cg", true);
    run(access_kernel<1, false, false, kDepth>, rows, "ld.nc", false);
  }
  TS_CUDA_CHECK(cudaFree(w));
  TS_CUDA_CHECK(cudaFree(sink));
}

struct Shape {
  const char* name;
  int n, k;
  bool swiglu;  // n = rows of the stacked gate/up weight
};

// Variant label of the current gemv tuning, e.g. "kc256_smem100k".
std::string gemv_variant() {
  const auto& t = detail::gemv_tuning();
  if (t.fill == 2) return "regpipe_70e44e1";
  if (t.fill == 3)
    return std::string(t.stages == 0  ? "splitreg"
                       : t.stages < 0 ? "splitasyncauto"
                                      : "splitasync" + std::to_string(t.stages)) +
           (t.split == 0 ? "_auto" : "_s" + std::to_string(t.split)) +
           (t.large_m_registers ? "" : "_ringm16") +
           (t.large_m_stages == 0 ? "" : "_lms" + std::to_string(t.large_m_stages));
  return std::string(t.fill == 0 ? "bulk" : "cpasync") + "_kc" + std::to_string(t.kc) + "_smem" +
         std::to_string(t.smem_budget_bytes / 1024) + "k";
}

// Copies of a random weight matrix of `elems` bf16 (seeds seed0, seed0 + 1, ...), at least two
// and together >= kColdBytes, for launches that rotate over them (cold: beyond L2).
std::vector<bf16*> cold_weight_copies(size_t elems, uint64_t seed0) {
  const size_t copies = std::max<size_t>(2, (kColdBytes + elems * 2 - 1) / (elems * 2));
  std::vector<bf16*> w(copies);
  for (size_t c = 0; c < copies; ++c) w[c] = alloc_bf16(elems, seed0 + c, 0.02f);
  return w;
}

// Returns the sum over ms of the in-graph (PDL) cold time per launch.
double bench_gemv(cublasHandle_t cublas, const Shape& shape, const std::vector<int>& ms,
                  bool full) {
  double total_us = 0;
  const size_t w_elems = static_cast<size_t>(shape.n) * shape.k;
  const std::vector<bf16*> w = cold_weight_copies(w_elems, 100);
  const int copies = static_cast<int>(w.size());
  bf16* x = alloc_bf16(static_cast<size_t>(16) * shape.k, 3, 1.0f);
  bf16 *out = nullptr, *tmp = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(16) * shape.n * sizeof(bf16)));
  TS_CUDA_CHECK(cudaMalloc(&tmp, static_cast<size_t>(16) * shape.n * sizeof(bf16)));
  const int launches = std::max(copies, 24) / copies * copies;
  for (int m : ms) {
    const double bytes = static_cast<double>(w_elems) * 2 + 2.0 * m * shape.k +
                         2.0 * m * (shape.swiglu ? shape.n / 2 : shape.n);
    auto ours = [&](cudaStream_t s, bf16* wp, bool pdl) {
      if (shape.swiglu)
        gemv_swiglu(wp, x, out, m, shape.n / 2, shape.k, s, pdl);
      else
        gemv(wp, x, out, m, shape.n, shape.k, s, pdl);
    };
    double t[2][2];  // [cold][pdl]
    for (int cold = 0; cold < 2; ++cold)
      for (int pdl = 0; pdl < 2; ++pdl) {
        if (!full && cold == 0) {
          t[cold][pdl] = 0;
          continue;
        }
        t[cold][pdl] = time_graph_us([&](cudaStream_t s) {
                         for (int i = 0; i < launches; ++i) ours(s, w[cold ? i % copies : 0], pdl);
                       }) /
                       launches;
      }
    // The steady-state period of a launch in a long PDL chain (a decode step's graph has ~300
    // kernels): the graph of 2 x launches less the graph of launches, per launch. Unlike t, it
    // leaves out the graph's own launch and drain (~9 us per replay, docs/kernels.md round 17).
    const double t_double = time_graph_us([&](cudaStream_t s) {
      for (int i = 0; i < 2 * launches; ++i) ours(s, w[i % copies], true);
    });
    const double period_us = (t_double - t[1][1] * launches) / launches;
    const double t_single =
        full ? time_single_us([&](cudaStream_t s, int i) { ours(s, w[i % copies], false); },
                              std::max(copies, 8))
             : 0;
    // cuBLAS: out^T[n][m] = W[n][k] . x^T, column-major view: C(n x m) = A^T(k x n)^T B(k x m).
    const float alpha = 1.0f, beta = 0.0f;
    const double t_cublas =
        !full ? 0 : time_graph_us([&](cudaStream_t s) {
                      CUBLAS_CHECK(cublasSetStream(cublas, s));
                      for (int i = 0; i < launches; ++i)
                        CUBLAS_CHECK(cublasGemmEx(
                            cublas, CUBLAS_OP_T, CUBLAS_OP_N, shape.n, m, shape.k, &alpha,
                            w[i % copies], CUDA_R_16BF, shape.k, x, CUDA_R_16BF, shape.k, &beta,
                            tmp, CUDA_R_16BF, shape.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
                    }) / launches;
    Row row;
    row.s("section", full ? "gemv" : "gemv_variant")
        .s("variant", gemv_variant())
        .s("shape", shape.name)
        .n("m", m)
        .n("n", shape.n)
        .n("k", shape.k)
        .b("fused_swiglu", shape.swiglu)
        .b("cold", true)
        .b("pdl", true)
        .s("timing", "captured graph of back-to-back launches, cold weights rotated")
        .n("copies", copies);
    row.n("launches", launches)
        .n("period_us", period_us)
        .n("pct_of_floor_period", 100.0 * bytes / (period_us * 1e-6) / 1e12 / g_floor_tbps)
        .n("time_no_pdl_us", t[1][0])
        .n("tbps_no_pdl", bytes / (t[1][0] * 1e-6) / 1e12)
        .n("pct_of_floor_no_pdl", 100.0 * bytes / (t[1][0] * 1e-6) / 1e12 / g_floor_tbps);
    if (full)
      row.n("single_launch_us", t_single)
          .n("pct_of_floor_single", 100.0 * bytes / (t_single * 1e-6) / 1e12 / g_floor_tbps)
          .n("warm_time_us", t[0][1])
          .n("warm_tbps", bytes / (t[0][1] * 1e-6) / 1e12)
          .n("cublas_time_us", t_cublas)
          .n("cublas_tbps", bytes / (t_cublas * 1e-6) / 1e12)
          .b("faster_than_cublas", t[1][1] < t_cublas);
    add_row(row, bytes, t[1][1]);
    total_us += t[1][1];
    if (full && m > 8) {
      // The m > 8 path side by side: launched with PDL (GemvTuning::pdl_max_rows = 16, as m <= 8
      // always is), with a small shared-memory carveout (large_m_carveout_percent = 15: the
      // 64 KB configuration, ~190 KB of L1 for the activation rows), both, and the weights
      // through the 2-slot refilled ring (large_m_stages = 2) without and with PDL.
      auto& tuning = detail::gemv_tuning();
      const detail::GemvTuning saved = tuning;
      // Then other carveouts, PDL-launched: for the register path 0 and 14 % (the 32 KB
      // configuration at most: its two blocks' 16 KB of partial sums each) and 25 %; for the ring
      // (two blocks of 64 + 16 KB) 0 and 14 % (the smallest configuration that holds them, 164 KB,
      // L1 ~92 KB), 30 and 45 % (the driver rounds up to a configuration that fits).
      for (const auto [pdl_rows, carveout, large_m_stages] :
           {std::tuple{16, -1, 0}, std::tuple{8, 15, 0}, std::tuple{16, 15, 0},
            std::tuple{8, -1, 2}, std::tuple{16, -1, 2}, std::tuple{16, 0, 0},
            std::tuple{16, 14, 0}, std::tuple{16, 25, 0}, std::tuple{16, 0, 2},
            std::tuple{16, 14, 2}, std::tuple{16, 30, 2}, std::tuple{16, 45, 2}}) {
        tuning.pdl_max_rows = pdl_rows;
        tuning.large_m_carveout_percent = carveout;
        tuning.large_m_stages = large_m_stages;
        const double us = time_graph_us([&](cudaStream_t s) {
                            for (int i = 0; i < launches; ++i) ours(s, w[i % copies], true);
                          }) /
                          launches;
        const std::string label = std::string("pdl_rows") + std::to_string(pdl_rows) + "_carveout" +
                                  std::to_string(carveout) + "_lms" +
                                  std::to_string(large_m_stages);
        std::printf("gemv m>8 %-14s m=%2d %-30s graph+pdl %7.2f us (%5.1f%%)\n", shape.name, m,
                    label.c_str(), us, 100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps);
        Row r;
        r.s("section", "gemv_large_m")
            .s("variant", gemv_variant() + "_" + label)
            .s("shape", shape.name)
            .n("m", m)
            .n("n", shape.n)
            .n("k", shape.k)
            .b("cold", true)
            .b("pdl", true);
        add_row(r, bytes, us);
      }
      tuning = saved;
    }
    std::printf(
        "gemv %-14s %-15s m=%2d  graph+pdl %7.2f us (%5.1f%%)  period %7.2f us (%5.1f%%)  graph "
        "%7.2f us (%5.1f%%)  single %7.2f us  warm %7.2f  cuBLAS %7.2f us (%5.1f%%)\n",
        gemv_variant().c_str(), shape.name, m, t[1][1],
        100.0 * bytes / (t[1][1] * 1e-6) / 1e12 / g_floor_tbps, period_us,
        100.0 * bytes / (period_us * 1e-6) / 1e12 / g_floor_tbps, t[1][0],
        100.0 * bytes / (t[1][0] * 1e-6) / 1e12 / g_floor_tbps, t_single, t[0][1], t_cublas,
        t_cublas > 0 ? 100.0 * bytes / (t_cublas * 1e-6) / 1e12 / g_floor_tbps : 0.0);
  }
  for (bf16* p : w) TS_CUDA_CHECK(cudaFree(p));
  TS_CUDA_CHECK(cudaFree(x));
  TS_CUDA_CHECK(cudaFree(out));
  TS_CUDA_CHECK(cudaFree(tmp));
  return total_us;
}

// Section `gemv_split`: the GEMV shapes the split rule (kernels/gemv_split.h) gave S > 1 on the
// H200 before fd6530c (the models the runtime runs beside Llama-3-8B: Llama-3.2-3B, the
// Llama-3-8B TP shards, Qwen3-30B-A3B's attention), Llama-3-8B's qkv and o, and two shapes the
// ring rule gives one block per SM (the TP2 gate_up, 896 tiles; Qwen3's o, 128 tiles), each
// under the default tuning and with the split and the ring forced (S = 1, 2, 4; ring of 3 = two
// blocks per SM, of 6 = one), side by side; graph + PDL (m > 8 as the runtime launches it: no PDL),
// cold weights, m = 1, 6, 16.
void bench_gemv_split() {
  const std::vector<Shape> split_shapes = {
      {"l3b_down", 3072, 8192, false},         {"l3b_qkv", 5120, 3072, false},
      {"l8b_tp2_qkv", 3072, 4096, false},      {"l8b_tp4_gate_up", 7168, 4096, false},
      {"l8b_tp4_qkv", 1536, 4096, false},      {"q3_qkv", 5120, 2048, false},
      {"l8b_qkv", 6144, 4096, false},          {"l8b_o", 4096, 4096, false},
      {"l8b_tp2_gate_up", 14336, 4096, false}, {"q3_o", 2048, 4096, false}};
  struct Variant {
    const char* name;
    int split, stages;
  };
  const Variant variants[] = {{"default", 0, -1}, {"s1_ring3", 1, 3}, {"s1_ring6", 1, 6},
                              {"s2_ring3", 2, 3}, {"s2_ring6", 2, 6}, {"s4_ring3", 4, 3}};
  auto& tuning = detail::gemv_tuning();
  const detail::GemvTuning saved = tuning;
  int sms = 0;
  TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (const Shape& shape : split_shapes) {
    const size_t w_elems = static_cast<size_t>(shape.n) * shape.k;
    const std::vector<bf16*> w = cold_weight_copies(w_elems, 300);
    const int copies = static_cast<int>(w.size());
    bf16* x = alloc_bf16(static_cast<size_t>(16) * shape.k, 3, 1.0f);
    bf16* out = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(16) * shape.n * sizeof(bf16)));
    const int launches = std::max(copies, 24) / copies * copies;
    const int split = gemv_default_split(shape.n, shape.k, sms);
    for (const int m : {1, 6, 16}) {
      const double bytes = static_cast<double>(w_elems) * 2 + 2.0 * m * shape.k + 2.0 * m * shape.n;
      std::printf("gemv_split %-16s %5dx%-5d auto S=%d m=%2d:", shape.name, shape.n, shape.k, split,
                  m);
      for (const Variant& v : variants) {
        tuning = saved;
        tuning.split = v.split;
        tuning.stages = v.stages;
        const double us = time_graph_us([&](cudaStream_t s) {
                            for (int i = 0; i < launches; ++i)
                              gemv(w[i % copies], x, out, m, shape.n, shape.k, s, true);
                          }) /
                          launches;
        Row r;
        r.s("section", "gemv_split")
            .s("variant", v.name)
            .s("shape", shape.name)
            .n("m", m)
            .n("n", shape.n)
            .n("k", shape.k)
            .n("split", v.split > 0 ? v.split : split)
            .b("cold", true)
            .b("pdl", m <= saved.pdl_max_rows);
        add_row(r, bytes, us);
        std::printf("  %s %.2f (%.1f%%)", v.name, us,
                    100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps);
      }
      std::printf("\n");
    }
    for (bf16* p : w) TS_CUDA_CHECK(cudaFree(p));
    TS_CUDA_CHECK(cudaFree(x));
    TS_CUDA_CHECK(cudaFree(out));
  }
  tuning = saved;
}

void bench_lm_head() {
  const int vocab = 128256, k = 4096;
  const size_t w_elems = static_cast<size_t>(vocab) * k;
  std::vector<bf16*> w = {alloc_bf16(w_elems, 200, 0.02f), alloc_bf16(w_elems, 201, 0.02f)};
  bf16* x = alloc_bf16(16 * k, 5, 1.0f);
  void* ws = nullptr;
  int *argmax = nullptr, *sampled = nullptr;
  float* top1 = nullptr;
  uint64_t* step = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&ws, lm_head_workspace_bytes(16, vocab)));
  TS_CUDA_CHECK(cudaMalloc(&argmax, 16 * sizeof(int)));
  TS_CUDA_CHECK(cudaMalloc(&sampled, 16 * sizeof(int)));
  TS_CUDA_CHECK(cudaMalloc(&top1, 16 * sizeof(float)));
  TS_CUDA_CHECK(cudaMalloc(&step, sizeof(uint64_t)));
  TS_CUDA_CHECK(cudaMemset(step, 0, sizeof(uint64_t)));
  int* topk_tokens = nullptr;
  float* topk_probs = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&topk_tokens, 16 * 16 * sizeof(int)));
  TS_CUDA_CHECK(cudaMalloc(&topk_probs, 16 * 16 * sizeof(float)));
  TS_CUDA_CHECK(cudaFree(ws));
  TS_CUDA_CHECK(cudaMalloc(&ws, lm_head_workspace_bytes(16, vocab, 16)));
  for (int m : {1, 6, 16}) {
    for (float temperature : {0.0f, 1.0f, -1.0f}) {  // -1: greedy plus top-16 with probabilities
      LmHeadOutputs outs{argmax, top1, sampled, nullptr};
      if (temperature < 0) {
        outs.topk = 16;
        outs.topk_tokens = topk_tokens;
        outs.topk_probs = topk_probs;
      }
      const double us =
          time_graph_us([&](cudaStream_t s) {
            for (int i = 0; i < 8; ++i)
              lm_head(w[i % 2], x, m, vocab, k,
                      SamplingParams{std::max(temperature, 0.0f), 1234, step}, ws, outs, s, true);
          }) /
          8;
      const double bytes = static_cast<double>(w_elems) * 2 + 2.0 * m * k;
      Row row;
      row.s("section", "lm_head_argmax_sample")
          .n("m", m)
          .n("n", vocab)
          .n("k", k)
          .b("cold", true)
          .b("pdl", true)
          .n("temperature", std::max(temperature, 0.0f))
          .n("topk", outs.topk);
      add_row(row, bytes, us);
      std::printf(
          "lm_head fused argmax/top1/sample m=%2d T=%.0f topk=%2d: %7.2f us %5.2f TB/s (%5.1f%%)\n",
          m, std::max(temperature, 0.0f), outs.topk, us, bytes / (us * 1e-6) / 1e12,
          100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps);
    }
  }
  for (bf16* p : w) TS_CUDA_CHECK(cudaFree(p));
  TS_CUDA_CHECK(cudaFree(x));
  TS_CUDA_CHECK(cudaFree(ws));
  TS_CUDA_CHECK(cudaFree(argmax));
  TS_CUDA_CHECK(cudaFree(sampled));
  TS_CUDA_CHECK(cudaFree(top1));
  TS_CUDA_CHECK(cudaFree(step));
  TS_CUDA_CHECK(cudaFree(topk_tokens));
  TS_CUDA_CHECK(cudaFree(topk_probs));
}

// Llama-3-8B attention shape: 32 q heads, 8 kv heads, 128 dims, context 8192.
struct KvSetup {
  KvCache cache;
  bf16* buffer = nullptr;
  bf16** bases = nullptr;
  int* ctx = nullptr;
};

// `requests` caches of the same length, one buffer.
KvSetup make_kv(int num_layers, int ctx_tokens, int capacity, int requests = 1, int kv_heads = 8) {
  KvSetup kv;
  kv.cache.num_layers = num_layers;
  kv.cache.num_kv_heads = kv_heads;
  kv.cache.capacity_tokens = capacity;
  const size_t elems = kv_cache_bytes_per_request(kv.cache) / sizeof(bf16);
  kv.buffer = alloc_bf16(elems * requests, 300, 1.0f);
  std::vector<bf16*> bases(static_cast<size_t>(requests));
  for (int r = 0; r < requests; ++r) bases[static_cast<size_t>(r)] = kv.buffer + elems * r;
  const std::vector<int> ctx(static_cast<size_t>(requests), ctx_tokens);
  TS_CUDA_CHECK(cudaMalloc(&kv.bases, sizeof(bf16*) * requests));
  TS_CUDA_CHECK(
      cudaMemcpy(kv.bases, bases.data(), sizeof(bf16*) * requests, cudaMemcpyHostToDevice));
  TS_CUDA_CHECK(cudaMalloc(&kv.ctx, sizeof(int) * requests));
  TS_CUDA_CHECK(cudaMemcpy(kv.ctx, ctx.data(), sizeof(int) * requests, cudaMemcpyHostToDevice));
  kv.cache.request_base = kv.bases;
  return kv;
}

void free_kv(KvSetup& kv) {
  TS_CUDA_CHECK(cudaFree(kv.buffer));
  TS_CUDA_CHECK(cudaFree(kv.bases));
  TS_CUDA_CHECK(cudaFree(kv.ctx));
}

// Attention (Llama-3-8B heads: 32 q / 8 kv, 128 dims) over 32 layers of KV back to back in one
// captured graph (cold: 32 x the layer's KV bytes >> L2). Bytes = the K and V rows read,
// 2 x (ctx + q_len) x 8 heads x 256 B. Per context 1024 / 8192 / 32768 and q_len 1 / 6 / 16: the
// default tuning (section `attention`), the pair with the driver's carveout and the pair with both
// split options (full ring prologue, Q in shared memory), PDL on and off. At ctx 8192, q_len 1 and
// 6: each split option alone, stream-only runs (tile math skipped), the split and combine kernels
// alone, and the floor kernel over one layer's K/V per launch.
std::string attention_label(const detail::AttentionTuning& t) {
  return "two_launch_cps" + std::to_string(t.ctas_per_sm) + (t.split_full_ring ? "_full" : "") +
         (t.split_q_smem ? "_qsmem" : "") + (t.carveout_max_shared ? "" : "_carvedrv") +
         (t.skip_math ? "_nomath" : "");
}

// The attention tunings compared side by side (attention section and layer chain).
std::vector<detail::AttentionTuning> attention_contenders(const detail::AttentionTuning& defaults) {
  detail::AttentionTuning pair = defaults, pair_opt = defaults;
  pair.split_full_ring = pair.split_q_smem = false;
  pair_opt.split_full_ring = pair_opt.split_q_smem = true;
  detail::AttentionTuning pair_drv = pair;  // the driver's carveout per kernel (round 4)
  pair_drv.carveout_max_shared = false;
  std::vector<detail::AttentionTuning> all = {defaults};
  for (const auto& t : {pair, pair_drv, pair_opt})
    if (attention_label(t) != attention_label(defaults)) all.push_back(t);
  return all;
}

void bench_attention() {
  const int layers = 32, num_q_heads = 32;
  auto& tuning = detail::attention_tuning();
  const detail::AttentionTuning defaults = tuning;
  bf16* q = alloc_bf16(16 * num_q_heads * kHeadDim, 9, 1.0f);
  bf16* out = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, 16 * num_q_heads * kHeadDim * sizeof(bf16)));

  // Times one configuration (graph of `layers` launches, per launch), PDL on and off.
  auto measure = [&](KvSetup& kv, int ctx, int q_len, const detail::AttentionTuning& t,
                     const char* section, bool both_pdl) {
    tuning = t;
    AttentionShape shape;
    shape.q_len = q_len;
    shape.num_q_heads = num_q_heads;
    const size_t ws_bytes = attention_workspace_bytes(shape, kv.cache);
    void* ws = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
    const double bytes = 2.0 * (ctx + q_len) * 8 * kHeadDim * 2;
    auto timed = [&](bool pdl) {
      return time_graph_us([&](cudaStream_t s) {
               for (int l = 0; l < layers; ++l)
                 decode_attention(q, kv.cache, l, kv.ctx, out, shape, ws, s, pdl);
             }) /
             layers;
    };
    const double t_pdl = timed(true), t_plain = both_pdl ? timed(false) : 0.0;
    auto pct = [&](double us) { return 100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps; };
    Row row;
    row.s("section", section)
        .s("variant", attention_label(t))
        .n("q_len", q_len)
        .n("ctx_tokens", ctx)
        .n("num_q_heads", num_q_heads)
        .n("num_kv_heads", 8)
        .n("head_dim", kHeadDim)
        .b("cold", true)
        .b("pdl", true)
        .s("timing", "captured graph, 32 layers of KV back to back");
    if (both_pdl) row.n("time_no_pdl_us", t_plain).n("pct_of_floor_no_pdl", pct(t_plain));
    add_row(row, bytes, t_pdl);
    std::printf(
        "attention %-32s ctx=%5d q_len=%2d: graph+pdl %7.2f us %5.2f TB/s (%5.1f%% of floor %5.2f "
        "us)",
        attention_label(t).c_str(), ctx, q_len, t_pdl, bytes / (t_pdl * 1e-6) / 1e12, pct(t_pdl),
        bytes / (g_floor_tbps * 1e12) * 1e6);
    if (both_pdl) std::printf("  graph %7.2f us (%5.1f%%)", t_plain, pct(t_plain));
    std::printf("\n");
    TS_CUDA_CHECK(cudaFree(ws));
    tuning = defaults;
    return t_pdl;
  };

  const std::vector<detail::AttentionTuning> contenders = attention_contenders(defaults);
  for (const int ctx : {1024, 8192, 32768}) {
    KvSetup kv = make_kv(layers, ctx, ctx + 16);
    for (const int q_len : {1, 6, 16})
      for (size_t i = 0; i < contenders.size(); ++i)
        measure(kv, ctx, q_len, contenders[i], i == 0 ? "attention" : "attention_variant", true);
    if (ctx == 8192) {
      // Reference: the floor kernel reading each layer's whole K/V block (33.6 MB) as its own
      // launch, 32 launches in a graph: the best a plain streaming kernel of this size does.
      unsigned* sink = nullptr;
      TS_CUDA_CHECK(cudaMalloc(&sink, sizeof(unsigned)));
      const size_t layer_bytes = kv_offset(kv.cache, 1, 0, 0) * sizeof(bf16);
      int sms = 0;
      TS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
      const double stream_us =
          time_graph_us([&](cudaStream_t s) {
            for (int l = 0; l < layers; ++l) {
              stream_read_kernel<8, true><<<sms * 4, 512, 0, s>>>(
                  reinterpret_cast<const uint4*>(kv.buffer + kv_offset(kv.cache, l, 0, 0)),
                  layer_bytes / 16, sink);
              TS_CUDA_CHECK(cudaGetLastError());
            }
          }) /
          layers;
      std::printf(
          "attention reference: stream_read of one layer's K/V (%.1f MB) per launch: %7.2f us "
          "(%5.1f%% of floor)\n",
          layer_bytes / 1e6, stream_us,
          100.0 * layer_bytes / (stream_us * 1e-6) / 1e12 / g_floor_tbps);
      Row ref;
      ref.s("section", "attention_variant")
          .s("variant", "stream_read_per_layer")
          .n("ctx_tokens", ctx)
          .b("cold", true)
          .b("pdl", false)
          .s("timing", "captured graph, 32 launches of the floor kernel, one layer's K/V each");
      add_row(ref, static_cast<double>(layer_bytes), stream_us);
      // The same bytes read by stream_read_kernel<..., kPdl> under PDL (everything before the
      // wait), at 1, 2 and 4 blocks of 512 threads per SM: with fewer than 4 the next launch's
      // blocks fit beside the running ones, so its reads can start before this launch drains.
      for (const int blocks_per_sm : {1, 2, 4}) {
        const double pdl_us =
            time_graph_us([&](cudaStream_t s) {
              for (int l = 0; l < layers; ++l)
                detail::launch(
                    stream_read_kernel<8, true, true>, dim3(sms * blocks_per_sm), dim3(512), 0, s,
                    true, reinterpret_cast<const uint4*>(kv.buffer + kv_offset(kv.cache, l, 0, 0)),
                    layer_bytes / 16, sink);
            }) /
            layers;
        std::printf(
            "attention reference: stream_read_pdl of one layer's K/V per launch, %d x 512 threads "
            "per SM: %7.2f us (%5.1f%% of floor)\n",
            blocks_per_sm, pdl_us, 100.0 * layer_bytes / (pdl_us * 1e-6) / 1e12 / g_floor_tbps);
        Row r;
        r.s("section", "attention_variant")
            .s("variant", "stream_read_pdl_per_layer_bps" + std::to_string(blocks_per_sm))
            .n("ctx_tokens", ctx)
            .b("cold", true)
            .b("pdl", true)
            .s("timing", "captured graph, 32 PDL launches reading before their dependency wait");
        add_row(r, static_cast<double>(layer_bytes), pdl_us);
      }
      TS_CUDA_CHECK(cudaFree(sink));

      // The pair: each split option alone, and stream-only (math skipped) without and with both.
      std::vector<detail::AttentionTuning> sweep;
      const detail::AttentionTuning pair = defaults;
      for (const auto [full, qsmem, nomath] :
           {std::tuple{true, false, false}, std::tuple{false, true, false},
            std::tuple{false, false, true}, std::tuple{true, true, true}}) {
        detail::AttentionTuning t = pair;
        t.split_full_ring = full;
        t.split_q_smem = qsmem;
        t.skip_math = nomath;
        sweep.push_back(t);
      }
      for (const auto& t : sweep)
        for (const int q_len : {1, 6}) measure(kv, ctx, q_len, t, "attention_variant", false);
      // The pair's kernels alone (no PDL): default split options and both options on.
      for (const bool opt : {false, true}) {
        for (const int q_len : {1, 6}) {
          for (const bool split : {true, false}) {
            detail::AttentionTuning t = pair;
            if (opt) t.split_full_ring = t.split_q_smem = true;
            t.launch_split = split;
            t.launch_combine = !split;
            tuning = t;
            AttentionShape shape;
            shape.q_len = q_len;
            void* ws = nullptr;
            const size_t ws_bytes = attention_workspace_bytes(shape, kv.cache);
            TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
            TS_CUDA_CHECK(cudaMemset(ws, 0, ws_bytes));
            const double us =
                time_graph_us([&](cudaStream_t s) {
                  for (int l = 0; l < layers; ++l)
                    decode_attention(q, kv.cache, l, kv.ctx, out, shape, ws, s, false);
                }) /
                layers;
            tuning = defaults;
            TS_CUDA_CHECK(cudaFree(ws));
            std::printf("attention %s q_len=%2d: %s kernel alone %7.2f us\n",
                        attention_label(t).c_str(), q_len, split ? "split" : "combine", us);
            Row row;
            row.s("section", "attention_variant")
                .s("variant", attention_label(t) + (split ? "_split_only" : "_combine_only"))
                .n("q_len", q_len)
                .n("ctx_tokens", ctx)
                .b("cold", true)
                .b("pdl", false);
            add_row(row, 2.0 * (ctx + q_len) * 8 * kHeadDim * 2, us);
          }
        }
      }
    }
    free_kv(kv);
  }
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
}

// Section `attention_batch`: Llama-3-8B's attention heads (32 q / 8 KV) for 2..32 requests of one
// context (1024, 2048, 8192) over a run's KV capacity (ctx + 128: 128 decode tokens, sized as the
// real backend sizes it), 32 layers of KV back to back in a captured graph with PDL (cold), q_len
// 1: the split count rounded down to one wave of blocks (AttentionTuning::splits_within_one_wave,
// the default) beside rounded up, in the same run. Bytes = the K and V rows read.
void bench_attention_batch() {
  const int layers = 32, num_q_heads = 32, kv_heads = 8, max_requests = 32;
  auto& tuning = detail::attention_tuning();
  const detail::AttentionTuning defaults = tuning;
  bf16* q = alloc_bf16(size_t{max_requests} * num_q_heads * kHeadDim, 9, 1.0f);
  bf16* out = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, size_t{max_requests} * num_q_heads * kHeadDim * sizeof(bf16)));
  for (const int ctx : {1024, 2048, 8192}) {
    for (const int requests : {2, 4, 8, 16, 32}) {
      KvSetup kv = make_kv(layers, ctx, ctx + 128, requests, kv_heads);
      AttentionShape shape;
      shape.num_requests = requests;
      shape.num_q_heads = num_q_heads;
      const double bytes = 2.0 * requests * (ctx + 1) * kv_heads * kHeadDim * 2;
      std::printf("attention_batch requests=%2d ctx=%5d capacity=%5d:", requests, ctx, ctx + 128);
      for (const bool one_wave : {true, false}) {
        tuning = defaults;
        tuning.splits_within_one_wave = one_wave;
        const int splits = attention_num_splits(shape, kv.cache);
        const int split_tokens = (kv.cache.capacity_tokens + splits - 1) / splits;
        const int used = std::min(splits, (ctx + 1 + split_tokens - 1) / split_tokens);
        void* ws = nullptr;
        TS_CUDA_CHECK(cudaMalloc(&ws, attention_workspace_bytes(shape, kv.cache)));
        const double us = time_graph_us([&](cudaStream_t s) {
                            for (int l = 0; l < layers; ++l)
                              decode_attention(q, kv.cache, l, kv.ctx, out, shape, ws, s, true);
                          }) /
                          layers;
        TS_CUDA_CHECK(cudaFree(ws));
        const char* name = one_wave ? "one_wave" : "round_up";
        std::printf("  %s %3d blocks %7.2f us (%5.1f%%)", name, requests * kv_heads * used, us,
                    100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps);
        Row row;
        row.s("section", "attention_batch")
            .s("variant", name)
            .n("requests", requests)
            .n("q_len", 1)
            .n("ctx_tokens", ctx)
            .n("capacity_tokens", kv.cache.capacity_tokens)
            .n("splits", splits)
            .n("blocks", requests * kv_heads * used)
            .n("num_q_heads", num_q_heads)
            .n("num_kv_heads", kv_heads)
            .n("head_dim", kHeadDim)
            .b("cold", true)
            .b("pdl", true)
            .s("timing", "captured graph, 32 layers of KV back to back");
        add_row(row, bytes, us);
      }
      std::printf("  (floor %.2f us)\n", bytes / (g_floor_tbps * 1e12) * 1e6);
      tuning = defaults;
      free_kv(kv);
    }
  }
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
}

// Section `attention_trace`: where the pair's time goes in a PDL chain. Llama-3-8B heads, one
// request at ctx 8192, 32 layers back to back in a captured graph with PDL (cold), every block of
// both kernels writing its timeline (AttentionTuning::trace; attention.h's layout: globaltimer at
// entry, prologue issued, past the dependency wait, first tile resident, last tile consumed, exit).
// From the last of 5 replays, for layers 2..31 (medians over layers), every time relative to t0 =
// the previous layer's last split exit: the previous combine's first entry, first block past its
// wait and last exit; this split's first and last entry, last prologue issued, first and last
// block past the wait, last block with its first tile resident, last tile consumed, first and last
// exit (= the period). Per block (medians over blocks and layers): first tile resident after the
// wait (about 0: the prologue had landed), residency (exit - entry), the combine blocks' time past
// their wait. Variants: the default at q_len 1 and 6, stream-only (skip_math), the full ring, one
// block per SM (ctas_per_sm 1), the combine's trigger after its wait / at exit (KernelTuning), the
// 4-part combine at this launch's 33 splits, the combine's context length before its wait
// (combine_ctx_before_wait), and at most 0 or 1 tiles before the split's wait
// (split_prewait_tiles).
void bench_attention_trace() {
  const int layers = 32, num_q_heads = 32, ctx = 8192;
  auto& tuning = detail::attention_tuning();
  const detail::AttentionTuning defaults = tuning;
  bf16* q = alloc_bf16(16 * num_q_heads * kHeadDim, 9, 1.0f);
  bf16* out = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, 16 * num_q_heads * kHeadDim * sizeof(bf16)));
  const size_t trace_words = size_t{layers} * kAttentionTraceSlotsPerLayer * kAttentionTraceWords;
  unsigned long long* trace = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&trace, trace_words * sizeof(unsigned long long)));
  KvSetup kv = make_kv(layers, ctx, ctx + 16);
  struct Variant {
    const char* name;
    int q_len;
    detail::AttentionTuning t;
    bool early_trigger = true, trigger_at_exit = false;  // KernelTuning: the combine's trigger
  };
  std::vector<Variant> variants = {{"default", 1, defaults}, {"default", 6, defaults}};
  detail::AttentionTuning t = defaults;
  t.skip_math = true;
  variants.push_back({"stream_only", 1, t});
  t = defaults;
  t.split_full_ring = true;
  variants.push_back({"full_ring", 1, t});
  t = defaults;
  t.ctas_per_sm = 1;
  variants.push_back({"one_block_per_sm", 1, t});
  variants.push_back({"trigger_after_wait", 1, defaults, false});
  variants.push_back({"trigger_at_exit", 1, defaults, true, true});
  variants.push_back({"trigger_at_exit", 6, defaults, true, true});
  t = defaults;
  t.split_full_ring = true;
  variants.push_back({"trigger_at_exit_full_ring", 1, t, true, true});
  t = defaults;
  t.combine_parts_min_splits = 0;  // the 4-part combine at this launch's 33 splits
  variants.push_back({"combine_parts", 1, t});
  variants.push_back({"combine_parts", 6, t});
  variants.push_back({"combine_parts_at_exit", 1, t, true, true});
  t = defaults;
  t.combine_ctx_before_wait = false;  // the default before round 29
  variants.push_back({"ctx_late", 1, t});
  t.combine_ctx_before_wait = true;
  variants.push_back({"ctx_early", 1, t});
  t.combine_parts_min_splits = 0;
  variants.push_back({"combine_parts_ctx_early", 1, t});
  variants.push_back({"combine_parts_ctx_early", 6, t});
  t.split_prewait_tiles = 1;
  variants.push_back({"combine_parts_ctx_early_prewait1", 1, t});
  t = defaults;
  for (const int tiles : {0, 1}) {
    t.split_prewait_tiles = tiles;
    variants.push_back({tiles == 0 ? "prewait0" : "prewait1", 1, t});
  }
  detail::KernelTuning& kt = detail::kernel_tuning();
  const detail::KernelTuning kernel_defaults = kt;
  for (const Variant& v : variants) {
    tuning = v.t;
    kt.early_trigger = v.early_trigger;
    kt.trigger_at_exit = v.trigger_at_exit;
    AttentionShape shape;
    shape.q_len = v.q_len;
    shape.num_q_heads = num_q_heads;
    void* ws = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&ws, attention_workspace_bytes(shape, kv.cache)));
    TS_CUDA_CHECK(cudaMemset(trace, 0, trace_words * sizeof(unsigned long long)));
    tuning.trace = trace;
    const double us = time_graph_us(
                          [&](cudaStream_t s) {
                            for (int l = 0; l < layers; ++l)
                              decode_attention(q, kv.cache, l, kv.ctx, out, shape, ws, s, true);
                          },
                          5) /
                      layers;
    tuning.trace = nullptr;
    std::vector<unsigned long long> h(trace_words);
    TS_CUDA_CHECK(cudaMemcpy(h.data(), trace, trace_words * sizeof(unsigned long long),
                             cudaMemcpyDeviceToHost));
    const int splits = attention_num_splits(shape, kv.cache);
    const int split_blocks = splits * kv.cache.num_kv_heads;
    const int combine_blocks = (num_q_heads / kv.cache.num_kv_heads) * v.q_len * 8;
    // Per layer: min / max of each word over the blocks that ran (exit written).
    struct Span {
      double lo[kAttentionTraceWords], hi[kAttentionTraceWords];
      int blocks = 0;
    };
    auto span = [&](int layer, int first, int count) {
      Span sp;
      std::fill(sp.lo, sp.lo + kAttentionTraceWords, 1e300);
      std::fill(sp.hi, sp.hi + kAttentionTraceWords, -1e300);
      for (int b = first; b < first + count; ++b) {
        const unsigned long long* w =
            &h[(static_cast<size_t>(layer) * kAttentionTraceSlotsPerLayer + b) *
               kAttentionTraceWords];
        if (w[kTraceExit] == 0) continue;
        ++sp.blocks;
        for (int i = 0; i < kTraceSm; ++i) {
          if (w[i] == 0) continue;
          sp.lo[i] = std::min(sp.lo[i], double(w[i]));
          sp.hi[i] = std::max(sp.hi[i], double(w[i]));
        }
      }
      return sp;
    };
    std::map<std::string, std::vector<double>> m;  // name -> per-layer values (us)
    std::vector<double> first_tile_after_wait, residency, combine_after_wait;
    int split_ran = 0, combine_ran = 0;
    for (int l = 2; l < layers; ++l) {
      const Span sp = span(l - 1, 0, split_blocks), s = span(l, 0, split_blocks);
      const Span c = span(l - 1, kAttentionTraceSplitSlots, combine_blocks);
      split_ran = s.blocks;
      combine_ran = c.blocks;
      const double t0 = sp.hi[kTraceExit];
      auto rel = [&](double t) { return (t - t0) * 1e-3; };
      m["combine_first_entry"].push_back(rel(c.lo[kTraceEntry]));
      m["combine_first_past_wait"].push_back(rel(c.lo[kTraceWaited]));
      m["combine_last_exit"].push_back(rel(c.hi[kTraceExit]));
      m["split_first_entry"].push_back(rel(s.lo[kTraceEntry]));
      m["split_last_entry"].push_back(rel(s.hi[kTraceEntry]));
      m["split_last_issued"].push_back(rel(s.hi[kTraceIssued]));
      m["split_first_past_wait"].push_back(rel(s.lo[kTraceWaited]));
      m["split_last_past_wait"].push_back(rel(s.hi[kTraceWaited]));
      m["split_last_first_tile"].push_back(rel(s.hi[kTraceFirstTile]));
      m["split_last_tile_consumed"].push_back(rel(s.hi[kTraceLastTile]));
      m["split_first_exit"].push_back(rel(s.lo[kTraceExit]));
      m["period"].push_back(rel(s.hi[kTraceExit]));
      for (int b = 0; b < split_blocks; ++b) {
        const unsigned long long* w =
            &h[(static_cast<size_t>(l) * kAttentionTraceSlotsPerLayer + b) * kAttentionTraceWords];
        if (w[kTraceExit] == 0 || w[kTraceFirstTile] == 0) continue;
        first_tile_after_wait.push_back((double(w[kTraceFirstTile]) - double(w[kTraceWaited])) *
                                        1e-3);
        residency.push_back((double(w[kTraceExit]) - double(w[kTraceEntry])) * 1e-3);
      }
      for (int c = 0; c < combine_blocks; ++c) {
        const unsigned long long* w =
            &h[(static_cast<size_t>(l - 1) * kAttentionTraceSlotsPerLayer +
                kAttentionTraceSplitSlots + c) *
               kAttentionTraceWords];
        if (w[kTraceExit] != 0)
          combine_after_wait.push_back((double(w[kTraceExit]) - double(w[kTraceWaited])) * 1e-3);
      }
    }
    auto median = [](std::vector<double> x) {
      std::sort(x.begin(), x.end());
      return x.empty() ? 0.0 : x[x.size() / 2];
    };
    const double bytes = 2.0 * (ctx + v.q_len) * 8 * kHeadDim * 2;
    std::printf(
        "attention trace %-16s q_len=%d (%d split + %d combine blocks): %6.2f us per layer "
        "(%5.1f%% of floor), period %6.2f\n"
        "  after the previous split's last exit: combine first entry %6.2f, first past wait "
        "%5.2f, last exit %5.2f | split first / last entry %6.2f / %6.2f, last prologue issued "
        "%6.2f, first / last past wait %5.2f / %5.2f, last first-tile %5.2f, last tile consumed "
        "%5.2f, first / last exit %5.2f / %5.2f us\n"
        "  per block: first tile resident %5.2f us after the wait, resident %5.2f us; combine "
        "blocks exit %5.2f us after their wait\n",
        v.name, v.q_len, split_ran, combine_ran, us,
        100.0 * bytes / (us * 1e-6) / 1e12 / g_floor_tbps, median(m["period"]),
        median(m["combine_first_entry"]), median(m["combine_first_past_wait"]),
        median(m["combine_last_exit"]), median(m["split_first_entry"]),
        median(m["split_last_entry"]), median(m["split_last_issued"]),
        median(m["split_first_past_wait"]), median(m["split_last_past_wait"]),
        median(m["split_last_first_tile"]), median(m["split_last_tile_consumed"]),
        median(m["split_first_exit"]), median(m["period"]), median(first_tile_after_wait),
        median(residency), median(combine_after_wait));
    Row r;
    r.s("section", "attention_trace")
        .s("variant", v.name)
        .n("q_len", v.q_len)
        .n("ctx_tokens", ctx)
        .n("split_blocks", split_ran)
        .n("combine_blocks", combine_ran)
        .b("cold", true)
        .b("pdl", true)
        .s("timing",
           "captured graph, 32 layers of KV back to back; trace medians over layers 2..31, us "
           "after the previous layer's last split exit");
    for (const auto& [name, values] : m) r.n(name + "_us", median(values));
    r.n("first_tile_after_wait_us", median(first_tile_after_wait))
        .n("block_residency_us", median(residency))
        .n("combine_block_after_wait_us", median(combine_after_wait));
    add_row(r, bytes, us);
    TS_CUDA_CHECK(cudaFree(ws));
  }
  tuning = defaults;
  kt = kernel_defaults;
  free_kv(kv);
  TS_CUDA_CHECK(cudaFree(trace));
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
}

// Section `attention_kv_heads`: the attention of Qwen3-30B-A3B's tensor-parallel shards (group 8:
// 8 q heads per KV head; 4 KV heads on one GPU, 2 at TP2, 1 at TP4), one request, over 48 layers
// of KV back to back in a captured graph with PDL (cold), ctx 1024 and 8192, q_len 1 and 8 (a
// verify of 7 drafts): the combine of 4 parts of 128 threads (AttentionTuning::combine_parts,
// forced at every split count here) against the earlier one (one thread per dimension over every
// split), side by side; at ctx 8192 also the split and each combine kernel alone (no PDL). The
// default uses the first from 97 splits up: 129 splits at 1 and 2 KV heads, 65 at 4. Bytes = the K
// and V rows read.
void bench_attention_kv_heads() {
  const int layers = 48;
  auto& tuning = detail::attention_tuning();
  const detail::AttentionTuning defaults = tuning;
  for (const int kv_heads : {4, 2, 1}) {
    const int num_q_heads = 8 * kv_heads;
    bf16* q = alloc_bf16(8 * num_q_heads * kHeadDim, 9, 1.0f);
    bf16* out = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&out, 8 * num_q_heads * kHeadDim * sizeof(bf16)));
    for (const int ctx : {1024, 8192}) {
      KvSetup kv = make_kv(layers, ctx, ctx + 64, 1, kv_heads);
      for (const int q_len : {1, 8}) {
        AttentionShape shape;
        shape.q_len = q_len;
        shape.num_q_heads = num_q_heads;
        const size_t ws_bytes = attention_workspace_bytes(shape, kv.cache);
        void* ws = nullptr;
        TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
        TS_CUDA_CHECK(cudaMemset(ws, 0, ws_bytes));
        const double bytes = 2.0 * (ctx + q_len) * kv_heads * kHeadDim * 2;
        struct Form {
          const char* name;
          bool parts, split, combine, pdl;
        };
        std::vector<Form> forms = {{"combine_parts", true, true, true, true},
                                   {"combine_serial", false, true, true, true}};
        if (ctx == 8192)
          for (const Form f : {Form{"split_only", true, true, false, false},
                               Form{"combine_parts_only", true, false, true, false},
                               Form{"combine_serial_only", false, false, true, false}})
            forms.push_back(f);
        std::printf("attention_kv_heads kv=%d q=%2d ctx=%5d q_len=%d:", kv_heads, num_q_heads, ctx,
                    q_len);
        for (const Form& f : forms) {
          tuning = defaults;
          tuning.combine_parts = f.parts;
          tuning.combine_parts_min_splits = 0;
          tuning.launch_split = f.split;
          tuning.launch_combine = f.combine;
          const double us = time_graph_us([&](cudaStream_t s) {
                              for (int l = 0; l < layers; ++l)
                                decode_attention(q, kv.cache, l, kv.ctx, out, shape, ws, s, f.pdl);
                            }) /
                            layers;
          std::printf("  %s %6.2f us", f.name, us);
          Row row;
          row.s("section", "attention_kv_heads")
              .s("variant", f.name)
              .n("q_len", q_len)
              .n("ctx_tokens", ctx)
              .n("num_q_heads", num_q_heads)
              .n("num_kv_heads", kv_heads)
              .n("head_dim", kHeadDim)
              .b("cold", layers * bytes > 2 * 60e6)  // the 48 layers' KV at least twice the L2
              .b("pdl", f.pdl)
              .s("timing", "captured graph, 48 layers of KV back to back");
          add_row(row, bytes, us);
        }
        std::printf("  (floor %.2f us)\n", bytes / (g_floor_tbps * 1e12) * 1e6);
        tuning = defaults;
        TS_CUDA_CHECK(cudaFree(ws));
      }
      free_kv(kv);
    }
    TS_CUDA_CHECK(cudaFree(q));
    TS_CUDA_CHECK(cudaFree(out));
  }
}

// Section `ncu` (asked for by name only): one eager launch of each kernel to profile with Nsight
// Compute (scripts/gpu_ncu.sh), nothing timed: the GEMV on the Llama-3-8B shapes at m = 1, 6 and
// 16 (lm_head as a plain GEMV of its shape), then the attention pair at ctx 8192, q_len 1 and 6.
void launch_ncu_targets(const std::vector<Shape>& shapes) {
  for (const Shape& shape : shapes) {
    bf16* w = alloc_bf16(static_cast<size_t>(shape.n) * shape.k, 100, 0.02f);
    bf16* x = alloc_bf16(static_cast<size_t>(16) * shape.k, 3, 1.0f);
    bf16* out = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&out, static_cast<size_t>(16) * shape.n * sizeof(bf16)));
    for (const int m : {1, 6, 16}) {
      if (shape.swiglu)
        gemv_swiglu(w, x, out, m, shape.n / 2, shape.k, g_stream, false);
      else
        gemv(w, x, out, m, shape.n, shape.k, g_stream, false);
      TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
      std::printf("ncu target: gemv %s m=%d\n", shape.name, m);
    }
    TS_CUDA_CHECK(cudaFree(w));
    TS_CUDA_CHECK(cudaFree(x));
    TS_CUDA_CHECK(cudaFree(out));
  }
  const int ctx = 8192, num_q_heads = 32;
  KvSetup kv = make_kv(1, ctx, ctx + 16);
  bf16* q = alloc_bf16(16 * num_q_heads * kHeadDim, 9, 1.0f);
  bf16* out = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, 16 * num_q_heads * kHeadDim * sizeof(bf16)));
  for (const int q_len : {1, 6}) {
    AttentionShape shape;
    shape.q_len = q_len;
    shape.num_q_heads = num_q_heads;
    void* ws = nullptr;
    TS_CUDA_CHECK(cudaMalloc(&ws, attention_workspace_bytes(shape, kv.cache)));
    decode_attention(q, kv.cache, 0, kv.ctx, out, shape, ws, g_stream, false);
    TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    TS_CUDA_CHECK(cudaFree(ws));
    std::printf("ncu target: attention ctx=%d q_len=%d\n", ctx, q_len);
  }
  TS_CUDA_CHECK(cudaFree(q));
  TS_CUDA_CHECK(cudaFree(out));
  free_kv(kv);
}

// One Llama-3-8B decode layer, 32 layers of distinct weights in one graph (cold, like a forward).
// m token rows: one request of m query positions at ctx 8192 (a verify pass), or with `requests`
// > 1 that many requests of m / requests positions at `ctx` (the engine's batched decode).
// trigger_sweep (section chain_trigger): only the 9-kernel chain and the chain with both fusions
// (6 kernels), PDL on, for each trigger placement of the small kernels (norm, rope, combine):
// before their wait (the default), after it, none (at exit; KernelTuning::trigger_at_exit); and
// for the attention's 4-part combine at every split count, its context length before its wait
// (AttentionTuning::combine_ctx_before_wait) and the GEMVs' rings of 3 and 2.
void bench_layer_chain(int m, bool diagnose, int requests = 1, int ctx = 8192,
                       bool trigger_sweep = false) {
  const int layers = 32, hidden = 4096, inter = 14336, capacity = ctx + 16;
  const int q_len = m / requests;
  char tag_buf[64];
  std::snprintf(tag_buf, sizeof(tag_buf), requests > 1 ? "m=%d (%d requests, ctx %d)" : "m=%d", m,
                requests, ctx);
  const std::string tag = tag_buf;
  const int qkv_n = (32 + 2 * 8) * kHeadDim;  // 6144
  struct Layer {
    bf16 *norm1, *qkv, *o, *norm2, *gate_up, *down;
    bf16 *qkv_folded, *gate_up_folded;  // norm1 / norm2 folded in (gemv_norm.h)
  };
  std::vector<Layer> w(layers);
  for (int l = 0; l < layers; ++l) {
    w[l].norm1 = alloc_bf16(hidden, 400 + l, 1.0f);
    w[l].qkv = alloc_bf16(static_cast<size_t>(qkv_n) * hidden, 500 + l, 0.02f);
    w[l].o = alloc_bf16(static_cast<size_t>(hidden) * hidden, 600 + l, 0.02f);
    w[l].norm2 = alloc_bf16(hidden, 700 + l, 1.0f);
    w[l].gate_up = alloc_bf16(static_cast<size_t>(2 * inter) * hidden, 800 + l, 0.02f);
    w[l].down = alloc_bf16(static_cast<size_t>(hidden) * inter, 900 + l, 0.02f);
    TS_CUDA_CHECK(cudaMalloc(&w[l].qkv_folded, static_cast<size_t>(qkv_n) * hidden * 2));
    TS_CUDA_CHECK(cudaMalloc(&w[l].gate_up_folded, static_cast<size_t>(2 * inter) * hidden * 2));
    fold_norm_weight(w[l].qkv, w[l].norm1, w[l].qkv_folded, qkv_n, hidden, nullptr);
    fold_norm_weight(w[l].gate_up, w[l].norm2, w[l].gate_up_folded, 2 * inter, hidden, nullptr);
  }
  KvSetup kv = make_kv(layers, ctx, capacity, requests);
  bf16* residual = alloc_bf16(static_cast<size_t>(m) * hidden, 11, 1.0f);
  bf16* delta = alloc_bf16(static_cast<size_t>(m) * hidden, 12, 1.0f);
  bf16 *normed, *qkv, *q, *attn, *act;
  TS_CUDA_CHECK(cudaMalloc(&normed, static_cast<size_t>(m) * hidden * 2));
  TS_CUDA_CHECK(cudaMalloc(&qkv, static_cast<size_t>(m) * qkv_n * 2));
  TS_CUDA_CHECK(cudaMalloc(&q, static_cast<size_t>(m) * 32 * kHeadDim * 2));
  TS_CUDA_CHECK(cudaMalloc(&attn, static_cast<size_t>(m) * 32 * kHeadDim * 2));
  TS_CUDA_CHECK(cudaMalloc(&act, static_cast<size_t>(m) * inter * 2));
  float* sq = nullptr;  // fused norms: the residual rows' tile sums of squares
  TS_CUDA_CHECK(cudaMalloc(&sq, static_cast<size_t>(m) * hidden / 16 * sizeof(float)));
  rms_sq_partials(residual, sq, m, hidden, nullptr);
  // The folds and sums above ran on the legacy stream; g_stream does not wait for it.
  TS_CUDA_CHECK(cudaDeviceSynchronize());
  AttentionShape shape;
  shape.num_requests = requests;
  shape.q_len = q_len;
  void* ws = nullptr;
  size_t ws_bytes = 0;  // enough for every attention contender timed below
  {
    const detail::AttentionTuning saved = detail::attention_tuning();
    for (const auto& t : attention_contenders(saved)) {
      detail::attention_tuning() = t;
      ws_bytes = std::max(ws_bytes, attention_workspace_bytes(shape, kv.cache));
    }
    detail::attention_tuning() = saved;
  }
  TS_CUDA_CHECK(cudaMalloc(&ws, ws_bytes));
  const RopeTable rope = llama3_rope_table();
  // mask bit i: PDL on for the i-th launcher of the layer (norm1, qkv, rope, attention, o,
  // norm2, gate_up, down); skip bit i: that launcher left out (a diagnostic: what its launch
  // costs the chain, the bound on what fusing it into a neighbour could gain; wrong numerics).
  // fused_rope: rope_kv_append and decode_attention as decode_attention_rope (launcher 3; 2 then
  // stands for nothing). fused_norms: the norms carried by the GEMVs (gemv_norm.h: o and down add
  // into the residual and write its tile sums of squares, qkv and gate+up scale by 1 / rms with
  // the norm weights folded into theirs; launchers 0 and 5 then stand for nothing).
  // qkv_stages > 0: the qkv projection launched on that ring (GemvTuning::stages, read at launch
  // time, so a captured graph keeps it), the other GEMVs on the tuning's.
  int qkv_stages = 0;
  auto forward = [&](cudaStream_t s, unsigned mask, unsigned skip = 0, bool fused_rope = false,
                     bool fused_norms = false) {
    auto on = [&](int i) { return ((mask >> i) & 1u) != 0; };
    auto run = [&](int i) { return ((skip >> i) & 1u) == 0; };
    detail::GemvTuning& tuning = detail::gemv_tuning();
    const int stages = tuning.stages;
    for (int l = 0; l < layers; ++l) {
      if (qkv_stages > 0) tuning.stages = qkv_stages;
      if (fused_norms) {
        gemv_normed(w[l].qkv_folded, residual, sq, 1e-5f, qkv, m, qkv_n, hidden, s, on(1));
      } else {
        if (run(0))
          rmsnorm_residual(delta, residual, w[l].norm1, normed, m, hidden, 1e-5f, s, on(0));
        if (run(1)) gemv(w[l].qkv, normed, qkv, m, qkv_n, hidden, s, on(1));
      }
      tuning.stages = stages;
      if (fused_rope) {
        if (run(3))
          decode_attention_rope(qkv, kv.cache, l, kv.ctx, rope, attn, shape, ws, s, on(3));
      } else {
        if (run(2))
          rope_kv_append(qkv, kv.ctx, kv.cache, l, q, requests, q_len, 32, rope, s, on(2));
        if (run(3)) decode_attention(q, kv.cache, l, kv.ctx, attn, shape, ws, s, on(3));
      }
      if (fused_norms) {
        gemv_residual(w[l].o, attn, residual, sq, m, hidden, hidden, s, on(4));
        gemv_swiglu_normed(w[l].gate_up_folded, residual, sq, 1e-5f, act, m, inter, hidden, s,
                           on(6));
        gemv_residual(w[l].down, act, residual, sq, m, hidden, inter, s, on(7));
        continue;
      }
      if (run(4)) gemv(w[l].o, attn, delta, m, hidden, hidden, s, on(4));
      if (run(5)) rmsnorm_residual(delta, residual, w[l].norm2, normed, m, hidden, 1e-5f, s, on(5));
      if (run(6)) gemv_swiglu(w[l].gate_up, normed, act, m, inter, hidden, s, on(6));
      if (run(7)) gemv(w[l].down, act, delta, m, hidden, inter, s, on(7));
    }
  };
  const double weight_bytes = 2.0 * (2.0 * hidden + static_cast<double>(qkv_n) * hidden +
                                     static_cast<double>(hidden) * hidden + 2.0 * inter * hidden +
                                     static_cast<double>(hidden) * inter);
  const double kv_bytes = 2.0 * requests * (ctx + q_len) * 8 * kHeadDim * 2;
  const double bytes = weight_bytes + kv_bytes;
  const double floor_us = bytes / (g_floor_tbps * 1e12) * 1e6;
  if (trigger_sweep) {
    detail::KernelTuning& kt = detail::kernel_tuning();
    detail::AttentionTuning& at = detail::attention_tuning();
    detail::GemvTuning& gt = detail::gemv_tuning();
    const detail::KernelTuning kernel_saved = kt;
    const detail::AttentionTuning attn_saved = at;
    const detail::GemvTuning gemv_saved = gt;
    // Each configuration from the defaults: the small kernels' trigger placement, the 4-part
    // combine at every split count (parts), the combine's context length before its wait
    // (ctx_early), every GEMV on the ring of 3 / the refilled ring of 2 (GemvTuning::stages), the
    // qkv projection alone on the ring of 2 (qkv_stages), the split's whole ring issued before its
    // wait (AttentionTuning::split_full_ring).
    auto after_wait = [&] { kt.early_trigger = false; };
    auto at_exit = [&] { kt.trigger_at_exit = true; };
    auto parts = [&] { at.combine_parts_min_splits = 0; };
    auto ctx_early = [&] { at.combine_ctx_before_wait = true; };
    const std::vector<std::pair<const char*, std::function<void()>>> configs = {
        {"before_wait", [] {}},
        {"after_wait", after_wait},
        {"at_exit", at_exit},
        {"before_wait+parts", parts},
        {"at_exit+parts", [&] { at_exit(), parts(); }},
        {"parts+gemv_ring3", [&] { parts(), gt.stages = 3; }},
        {"parts+gemv_ring2", [&] { parts(), gt.stages = 2; }},
        {"ctx_early", ctx_early},  // the default since round 29: ctx_late is the other side
        {"ctx_late", [&] { at.combine_ctx_before_wait = false; }},
        {"parts+ctx_early", [&] { parts(), ctx_early(); }},
        {"parts+ctx_early+ring3", [&] { parts(), ctx_early(), gt.stages = 3; }},
        {"parts+ctx_early+full_ring", [&] { parts(), ctx_early(), at.split_full_ring = true; }},
        {"parts+ctx_early+qkv_ring2", [&] { parts(), ctx_early(), qkv_stages = 2; }},
        {"parts+ctx_early+ring3+qkv_ring2",
         [&] { parts(), ctx_early(), gt.stages = 3, qkv_stages = 2; }}};
    for (const auto& [label, set] : configs) {
      kt = kernel_saved;
      at = attn_saved;
      gt = gemv_saved;
      qkv_stages = 0;
      set();
      const double us9 = time_graph_us([&](cudaStream_t s) { forward(s, 0xFFu); }, 7) / layers;
      const double us6 =
          time_graph_us([&](cudaStream_t s) { forward(s, 0xFFu, 0, true, true); }, 7) / layers;
      std::printf(
          "  layer chain %s %-21s: 9 kernels %7.2f us (%.3fx), norms + rope fused (6 kernels) "
          "%7.2f us (%.3fx of floor %.2f us)\n",
          tag.c_str(), label, us9, us9 / floor_us, us6, us6 / floor_us, floor_us);
      for (const int kernels : {9, 6}) {
        Row row;
        row.s("section", "layer_chain_trigger")
            .s("trigger", label)
            .n("m", m)
            .n("requests", requests)
            .n("ctx_tokens", ctx)
            .b("cold", true)
            .b("pdl", true)
            .n("kernels_per_layer", kernels)
            .n("time_over_floor", (kernels == 9 ? us9 : us6) / floor_us);
        add_row(row, bytes, kernels == 9 ? us9 : us6);
      }
    }
    kt = kernel_saved;
    at = attn_saved;
    gt = gemv_saved;
    qkv_stages = 0;
  }
  if (!trigger_sweep) {
    // Each attention contender (attention_contenders: the default first), PDL off and on; the
    // diagnostics below use the default.
    auto& attn_tuning = detail::attention_tuning();
    const detail::AttentionTuning attn_defaults = attn_tuning;
    const std::vector<detail::AttentionTuning> contenders = attention_contenders(attn_defaults);
    double t[2] = {0, 0}, best_us = 1e30;
    size_t best = 0;
    for (size_t v = 0; v < contenders.size(); ++v) {
      attn_tuning = contenders[v];
      double tv[2];
      for (int pdl = 0; pdl < 2; ++pdl)
        tv[pdl] = time_graph_us([&](cudaStream_t s) { forward(s, pdl ? 0xFFu : 0u); }, 7) / layers;
      attn_tuning = attn_defaults;
      if (v == 0) {
        t[0] = tv[0];
        t[1] = tv[1];
      }
      if (tv[1] < best_us) {
        best_us = tv[1];
        best = v;
      }
      std::printf(
          "  layer chain %s attention %-32s: pdl off %7.2f us, pdl on %7.2f us (%.3fx / %.3fx of "
          "floor)%s\n",
          tag.c_str(), attention_label(contenders[v]).c_str(), tv[0], tv[1], tv[0] / floor_us,
          tv[1] / floor_us, v == 0 ? "  [default]" : "");
      for (int pdl = 0; pdl < 2; ++pdl) {
        Row row;
        row.s("section", v == 0 ? "layer_chain_attention_default" : "layer_chain_attention_variant")
            .s("attention_variant", attention_label(contenders[v]))
            .n("m", m)
            .n("requests", requests)
            .n("ctx_tokens", ctx)
            .b("cold", true)
            .b("pdl", pdl == 1)
            .n("time_over_floor", tv[pdl] / floor_us);
        add_row(row, bytes, tv[pdl]);
      }
    }

    const detail::AttentionTuning& b = contenders[best];
    std::printf(
        "  layer chain %s fastest attention with PDL on: %s (%.2f us; kernels/tuning.h "
        "AttentionTuning: split_full_ring %d, split_q_smem %d, carveout_max_shared %d)\n",
        tag.c_str(), attention_label(b).c_str(), best_us, b.split_full_ring ? 1 : 0,
        b.split_q_smem ? 1 : 0, b.carveout_max_shared ? 1 : 0);

    {  // rope_kv_append fused into the attention's split kernel (decode_attention_rope), PDL on
      const double us =
          time_graph_us([&](cudaStream_t s) { forward(s, 0xFFu, 0, true); }, 7) / layers;
      std::printf(
          "  layer chain %s rope fused into attention (8 kernels): pdl on %7.2f us (%.3fx of "
          "floor; "
          "separate %7.2f)\n",
          tag.c_str(), us, us / floor_us, t[1]);
      Row row;
      row.s("section", "layer_chain_fused_rope")
          .n("m", m)
          .n("requests", requests)
          .n("ctx_tokens", ctx)
          .b("pdl", true)
          .n("separate_time_us", t[1])
          .n("time_over_floor", us / floor_us);
      add_row(row, bytes, us);
    }

    // The norms carried by the GEMVs (7 launches per layer; 6 with the fused rope as well), PDL on
    // and off. Same floor: the folded weights are the same bytes, the norm weights are not read.
    for (const bool with_rope : {false, true}) {
      double us[2];
      for (int pdl = 0; pdl < 2; ++pdl)
        us[pdl] =
            time_graph_us([&](cudaStream_t s) { forward(s, pdl ? 0xFFu : 0u, 0, with_rope, true); },
                          7) /
            layers;
      std::printf(
          "  layer chain %s norms fused into the GEMVs%s (%d kernels): pdl off %7.2f us, pdl on "
          "%7.2f us (%.3fx of floor; separate %7.2f)\n",
          tag.c_str(), with_rope ? " + rope fused" : "", with_rope ? 6 : 7, us[0], us[1],
          us[1] / floor_us, t[1]);
      for (int pdl = 0; pdl < 2; ++pdl) {
        Row row;
        row.s("section", with_rope ? "layer_chain_fused_norms_rope" : "layer_chain_fused_norms")
            .n("m", m)
            .n("requests", requests)
            .n("ctx_tokens", ctx)
            .b("pdl", pdl == 1)
            .n("separate_time_us", t[pdl])
            .n("time_over_floor", us[pdl] / floor_us);
        add_row(row, bytes, us[pdl]);
      }
    }

    if (requests == 1 && m == 1) {  // launchers left out, PDL on (a bound for fusions)
      for (const auto& [label, skip] :
           {std::pair{"norm1+norm2", 0x21u}, std::pair{"rope", 0x04u},
            std::pair{"norm1+rope+norm2", 0x25u}, std::pair{"attention", 0x08u}}) {
        const double us =
            time_graph_us([&](cudaStream_t s) { forward(s, 0xFFu, skip); }, 5) / layers;
        std::printf("  layer chain %s without %-17s: pdl on %7.2f us (%.3fx of the full floor)\n",
                    tag.c_str(), label, us, us / floor_us);
        Row row;
        row.s("section", "layer_chain_left_out").n("m", m).s("left_out", label);
        add_row(row, bytes, us);
      }
    }
    if (diagnose) {  // PDL off for one launcher at a time, and early triggers off
      const char* names[8] = {"norm1", "qkv", "rope", "attention", "o", "norm2", "gate_up", "down"};
      for (int i = 0; i < 8; ++i) {
        const double us =
            time_graph_us([&](cudaStream_t s) { forward(s, 0xFFu & ~(1u << i)); }, 5) / layers;
        std::printf("  layer chain %s pdl on except %-9s: %7.2f us\n", tag.c_str(), names[i], us);
        Row row;
        row.s("section", "layer_chain_pdl_diagnostic")
            .n("m", m)
            .n("requests", requests)
            .s("pdl_off_for", names[i]);
        add_row(row, bytes, us);
      }
      // Whole-chain tunings, PDL on and off: early triggers off; for m > 8 the GEMV ring path
      // instead of the register path; split-K forced to 1 (no thread-block clusters).
      auto tuned = [&](const char* label, auto set, auto reset) {
        double us[2];
        set();
        for (int pdl = 0; pdl < 2; ++pdl)
          us[pdl] =
              time_graph_us([&](cudaStream_t s) { forward(s, pdl ? 0xFFu : 0u); }, 5) / layers;
        reset();
        std::printf("  layer chain %s %-28s: pdl off %7.2f us, pdl on %7.2f us\n", tag.c_str(),
                    label, us[0], us[1]);
        for (int pdl = 0; pdl < 2; ++pdl) {
          Row row;
          row.s("section", "layer_chain_pdl_diagnostic")
              .n("m", m)
              .n("requests", requests)
              .s("pdl_off_for", pdl ? "none" : "all")
              .s("tuning", label);
          add_row(row, bytes, us[pdl]);
        }
      };
      detail::KernelTuning& kt = detail::kernel_tuning();
      detail::GemvTuning& gt = detail::gemv_tuning();
      const detail::GemvTuning gemv_saved = gt;
      tuned(
          "early triggers off", [&] { kt.early_trigger = false; },
          [&] { kt.early_trigger = true; });
      if (m > 8)
        tuned(
            "gemv ring path for m > 8", [&] { gt.large_m_registers = false; },
            [&] { gt = gemv_saved; });
      tuned(
          "gemv split 1 (no clusters)", [&] { gt.split = 1; }, [&] { gt = gemv_saved; });
    }
    for (int pdl = 0; pdl < 2; ++pdl) {
      Row row;
      row.s("section", "layer_chain")
          .s("model", "llama3-8b")
          .s("attention_variant", attention_label(attn_defaults))
          .s("gemv_variant",
             gemv_variant() + "_pdlrows" + std::to_string(detail::gemv_tuning().pdl_max_rows))
          .n("m", m)
          .n("requests", requests)
          .n("ctx_tokens", ctx)
          .n("layers_in_graph", layers)
          .b("cold", true)
          .b("pdl", pdl == 1)
          .n("kernels_per_layer", 9)
          .n("time_over_floor", t[pdl] / floor_us);
      add_row(row, bytes, t[pdl]);
    }
    std::printf(
        "layer chain %s (9 kernels, graph of %d layers): pdl off %7.2f us, pdl on %7.2f us, floor "
        "%7.2f us -> %.3fx / %.3fx of floor\n",
        tag.c_str(), layers, t[0], t[1], bytes / (g_floor_tbps * 1e12) * 1e6,
        t[0] / (bytes / (g_floor_tbps * 1e12) * 1e6), t[1] / (bytes / (g_floor_tbps * 1e12) * 1e6));
  }
  for (auto& l : w)
    for (bf16* p :
         {l.norm1, l.qkv, l.o, l.norm2, l.gate_up, l.down, l.qkv_folded, l.gate_up_folded})
      TS_CUDA_CHECK(cudaFree(p));
  for (bf16* p : {residual, delta, normed, qkv, q, attn, act}) TS_CUDA_CHECK(cudaFree(p));
  TS_CUDA_CHECK(cudaFree(sq));
  TS_CUDA_CHECK(cudaFree(ws));
  free_kv(kv);
}

// The fields every MoE row starts with: section, model, shape, rows and distinct experts.
Row moe_row(const char* section, const MoeShape& shape, int m, int distinct) {
  Row row;
  row.s("section", section)
      .s("model", "qwen3-30b-a3b")
      .n("m", m)
      .n("hidden", shape.hidden)
      .n("num_experts", shape.num_experts)
      .n("top_k", shape.top_k)
      .n("expert_inter", shape.expert_inter)
      .n("distinct_experts", distinct);
  return row;
}

// Prefill of one Qwen3-30B-A3B MoE layer over m = 1024 and 4096 rows: moe_prefill (grouped
// tensor-core GEMMs) beside the path the runtime took before it, moe_forward in 16-row calls
// (kGemvMaxRows), same rows and weights. Graphs of two calls alternating the two weight copies
// (1.2 GB each: cold). FLOPs: router 2 m E H + experts 2 m top_k 3 EI H; judged against 989
// TFLOP/s, the H200 SXM's dense BF16 tensor-core peak (NVIDIA H200 datasheet: 1,979 with
// sparsity). Bytes: the weights of every expert some token picked, the router, x and out, each
// once (the floor a perfect kernel would stream).
void bench_moe_prefill(const MoeShape& shape, const MoeWeights (&w)[2]) {
  constexpr double kPeakTflops = 989.0;
  constexpr int kMaxRows = 4096;
  const size_t H = static_cast<size_t>(shape.hidden);
  bf16* x = alloc_bf16(kMaxRows * H, 17, 1.0f);
  bf16* out = nullptr;
  void* ws = nullptr;
  int* ids = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, kMaxRows * H * sizeof(bf16)));
  TS_CUDA_CHECK(cudaMalloc(&ws, std::max(moe_prefill_workspace_bytes(kMaxRows, shape),
                                         moe_workspace_bytes(kGemvMaxRows, shape))));
  TS_CUDA_CHECK(cudaMalloc(&ids, size_t{kMaxRows} * shape.top_k * sizeof(int)));
  for (int m : {1024, 4096}) {
    moe_prefill(x, w[0], m, shape, ws, out, g_stream, MoeRouting{ids, nullptr});
    std::vector<int> host(static_cast<size_t>(m) * shape.top_k);
    TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    TS_CUDA_CHECK(cudaMemcpy(host.data(), ids, host.size() * sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(host.begin(), host.end());
    const int distinct = static_cast<int>(std::unique(host.begin(), host.end()) - host.begin());
    const double expert_params = 3.0 * shape.expert_inter * shape.hidden;
    const double bytes =
        2.0 * expert_params * distinct + 2.0 * shape.num_experts * H + 2.0 * 2.0 * m * H;
    const double flops = 2.0 * m * shape.num_experts * H + 2.0 * m * shape.top_k * expert_params;
    const double t_new = time_graph_us(
                             [&](cudaStream_t s) {
                               for (int i = 0; i < 2; ++i)
                                 moe_prefill(x, w[i], m, shape, ws, out, s);
                             },
                             5) /
                         2;
    const double t_old =
        time_graph_us(
            [&](cudaStream_t s) {
              for (int i = 0; i < 2; ++i)
                for (int r0 = 0; r0 < m; r0 += kGemvMaxRows)
                  moe_forward(x + r0 * H, w[i], kGemvMaxRows, shape, ws, out + r0 * H, s, false);
            },
            3) /
        2;
    const double tflops = flops / (t_new * 1e-6) / 1e12;
    Row row = moe_row("moe_prefill", shape, m, distinct);
    row.b("cold", true)
        .n("launches", 7)
        .n("flops", flops)
        .n("tflops", tflops)
        .n("peak_tflops", kPeakTflops)
        .n("pct_of_peak", 100.0 * tflops / kPeakTflops)
        .n("moe_forward_16_rows_us", t_old)
        .n("speedup", t_old / t_new);
    add_row(row, bytes, t_new);
    std::printf(
        "moe_prefill qwen3-30b-a3b m=%d (%d experts): %9.1f us, %6.1f TFLOP/s (%4.1f%% of %.0f "
        "dense bf16), %5.3f TB/s (%4.1f%% of floor); moe_forward x %d calls of 16 rows: %9.1f us "
        "(%.1fx slower)\n",
        m, distinct, t_new, tflops, 100.0 * tflops / kPeakTflops, kPeakTflops,
        bytes / (t_new * 1e-6) / 1e12, 100.0 * bytes / (t_new * 1e-6) / 1e12 / g_floor_tbps,
        m / kGemvMaxRows, t_old, t_old / t_new);
  }
  TS_CUDA_CHECK(cudaFree(x));
  TS_CUDA_CHECK(cudaFree(out));
  TS_CUDA_CHECK(cudaFree(ws));
  TS_CUDA_CHECK(cudaFree(ids));
}

// Qwen3-30B-A3B MoE layer (hidden 2048, 128 experts, top-8, expert width 768), two full copies of
// the expert weights alternating (cold). Bytes = the selected experts' gate+up+down (+ router).
void bench_moe() {
  MoeShape shape;  // defaults are the Qwen3-30B-A3B shape
  const size_t gu = static_cast<size_t>(shape.num_experts) * 2 * shape.expert_inter * shape.hidden;
  const size_t dn = static_cast<size_t>(shape.num_experts) * shape.hidden * shape.expert_inter;
  const size_t rt = static_cast<size_t>(shape.num_experts) * shape.hidden;
  MoeWeights w[2];
  for (int c = 0; c < 2; ++c)
    w[c] = MoeWeights{alloc_bf16(rt, 1000 + c, 0.02f), alloc_bf16(gu, 1010 + c, 0.02f),
                      alloc_bf16(dn, 1020 + c, 0.02f), nullptr, nullptr};
  bf16* x = alloc_bf16(16 * shape.hidden, 13, 1.0f);
  bf16* out = nullptr;
  void* ws = nullptr;
  int* ids = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&out, 16 * shape.hidden * sizeof(bf16)));
  TS_CUDA_CHECK(cudaMalloc(&ws, moe_workspace_bytes(16, shape)));
  TS_CUDA_CHECK(cudaMalloc(&ids, 16 * shape.top_k * sizeof(int)));
  // The grouped expert GEMVs side by side (GemvTuning::moe_fill / moe_stages): the split
  // kernel's grouped mode on each weight path (the default first) and the bulk-copy stage ring.
  struct Variant {
    const char* name;
    int fill, stages;
    bool warp_tiles;
  };
  // (m > 8: moe_large_m_stages, set to the same path; the default row is marked.)
  const Variant variants[] = {{"split_ring3", 3, 3, false}, {"split_registers", 3, 0, false},
                              {"split_ring2", 3, 2, false}, {"split_ring6", 3, 6, false},
                              {"warp_ring3", 3, 3, true},   {"warp_registers", 3, 0, true},
                              {"warp_ring2", 3, 2, true},   {"warp_ring6", 3, 6, true},
                              {"bulk_ring", 0, 0, false}};
  const detail::GemvTuning saved = detail::gemv_tuning();
  for (int m : {1, 6, 16}) {
    moe_forward(x, w[0], m, shape, ws, out, g_stream, false, MoeRouting{ids, nullptr});
    std::vector<int> host(m * shape.top_k);
    TS_CUDA_CHECK(cudaStreamSynchronize(g_stream));
    TS_CUDA_CHECK(cudaMemcpy(host.data(), ids, host.size() * sizeof(int), cudaMemcpyDeviceToHost));
    std::sort(host.begin(), host.end());
    const int distinct = static_cast<int>(std::unique(host.begin(), host.end()) - host.begin());
    const double expert_bytes = 2.0 * 3 * shape.expert_inter * shape.hidden * distinct;
    const double bytes = expert_bytes + 2.0 * rt;
    for (const Variant& v : variants) {
      detail::gemv_tuning().moe_fill = v.fill;
      detail::gemv_tuning().moe_stages = v.stages;
      detail::gemv_tuning().moe_large_m_stages = v.stages;
      detail::gemv_tuning().moe_warp_tiles = v.warp_tiles;
      double t[2];
      for (int pdl = 0; pdl < 2; ++pdl)
        t[pdl] = time_graph_us([&](cudaStream_t s) {
                   for (int i = 0; i < 16; ++i) moe_forward(x, w[i % 2], m, shape, ws, out, s, pdl);
                 }) /
                 16;
      detail::gemv_tuning() = saved;
      Row row = moe_row("moe", shape, m, distinct);
      row.s("variant", v.name)
          .b("default", v.fill == saved.moe_fill && v.warp_tiles == saved.moe_warp_tiles &&
                            v.stages == (m > 8 ? saved.moe_large_m_stages : saved.moe_stages))
          .n("expert_bytes", expert_bytes)
          .b("cold", true)
          .b("pdl", true)
          .n("launches", 5)
          .n("time_no_pdl_us", t[0]);
      add_row(row, bytes, t[1]);
      std::printf(
          "moe qwen3-30b-a3b m=%d (%d experts, %.1f MB + router) %-16s: graph+pdl %7.2f us "
          "(%5.1f%% of floor %.2f us), graph %7.2f us\n",
          m, distinct, expert_bytes / 1e6, v.name, t[1],
          100.0 * bytes / (t[1] * 1e-6) / 1e12 / g_floor_tbps, bytes / (g_floor_tbps * 1e6), t[0]);
    }
  }
  bench_moe_prefill(shape, w);
  for (auto& c : w)
    for (const bf16* p : {c.router, c.gate_up, c.down})
      TS_CUDA_CHECK(cudaFree(const_cast<bf16*>(p)));
  TS_CUDA_CHECK(cudaFree(x));
  TS_CUDA_CHECK(cudaFree(out));
  TS_CUDA_CHECK(cudaFree(ws));
  TS_CUDA_CHECK(cudaFree(ids));
}

std::string commit_id(const char* arg) {
  if (arg != nullptr) return arg;
  if (const char* env = std::getenv("TWINSTEP_COMMIT")) return env;
  std::string out;
  if (FILE* f = popen(
          "git rev-parse HEAD 2>/dev/null && (git diff --quiet HEAD -- 2>/dev/null || echo -dirty)",
          "r")) {
    char buf[128];
    while (std::fgets(buf, sizeof(buf), f)) out += buf;
    pclose(f);
  }
  out.erase(std::remove(out.begin(), out.end(), '\n'), out.end());
  return out.empty() ? "unknown" : out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path, command;
  const char* commit = nullptr;
  std::vector<std::string> only;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    command += (i ? " " : "") + a;
    if (a == "--out" && i + 1 < argc) out_path = argv[i + 1];
    if (a == "--commit" && i + 1 < argc) commit = argv[i + 1];
    if (a == "--only" && i + 1 < argc) only.push_back(argv[i + 1]);  // repeatable
  }
  // Sections: gemv (with its variant sweep), access, attention, layer_chain, moe, lm_head; all by
  // default.
  auto want = [&](const char* section) {
    return only.empty() || std::find(only.begin(), only.end(), section) != only.end();
  };
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach a log even if a later step aborts
  cudaDeviceProp prop;
  TS_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  TS_CUDA_CHECK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  std::printf("GPU %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);

  g_floor_tbps = measure_floor();
  std::printf("floor (best streaming read): %.3f TB/s\n", g_floor_tbps);
  {
    Row r;
    r.s("section", "floor")
        .s("kernel", "stream_read 4 GiB, 16-byte loads, best launch shape and L2 prefetch hint")
        .n("floor_tbps", g_floor_tbps);
    g_rows.push_back(r);
  }

  cublasHandle_t cublas;
  CUBLAS_CHECK(cublasCreate(&cublas));
  void* cublas_ws = nullptr;
  TS_CUDA_CHECK(cudaMalloc(&cublas_ws, size_t{64} << 20));
  CUBLAS_CHECK(cublasSetWorkspace(cublas, cublas_ws, size_t{64} << 20));

  const std::vector<Shape> shapes = {
      {"qkv", 6144, 4096, false},      {"o", 4096, 4096, false},
      {"gate_up", 28672, 4096, false}, {"gate_up_swiglu", 28672, 4096, true},
      {"down", 4096, 14336, false},    {"lm_head", 128256, 4096, false}};
  // Variants of the gemv at m = 1 (graph, PDL on and off); the one with the least total time over
  // the five Llama shapes is used for everything after (its name is in each row's "variant").
  auto& tuning = detail::gemv_tuning();
  detail::GemvTuning best = tuning;
  double best_us = 1e30;
  std::vector<detail::GemvTuning> gemv_sweep = {
      detail::GemvTuning{256, 100 * 1024, 2},        detail::GemvTuning{256, 100 * 1024, 3, 0, 0},
      detail::GemvTuning{256, 100 * 1024, 3, 0, 3},  detail::GemvTuning{256, 100 * 1024, 3, 1, 6},
      detail::GemvTuning{256, 100 * 1024, 3, 0, -1}, detail::GemvTuning{256, 100 * 1024, 3, 0, 2}};
  if (!want("gemv")) gemv_sweep.clear();
  for (const detail::GemvTuning v : gemv_sweep) {
    tuning = v;
    double sum = 0;
    for (const Shape& s : shapes)
      if (!(s.n == 28672 && !s.swiglu)) sum += bench_gemv(cublas, s, {1}, false);
    std::printf("gemv variant %s: sum of m=1 times %.2f us\n", gemv_variant().c_str(), sum);
    if (sum < best_us) {
      best_us = sum;
      best = v;
    }
  }
  tuning = best;
  if (std::find(only.begin(), only.end(), "ncu") != only.end()) launch_ncu_targets(shapes);
  if (want("gemv")) {
    std::printf("gemv variant used below: %s\n", gemv_variant().c_str());
    for (const Shape& s : shapes) bench_gemv(cublas, s, {1, 6, 16}, true);
  }
  if (want("gemv_split")) bench_gemv_split();
  if (want("access")) bench_access();
  if (want("l2_prefetch")) bench_l2_prefetch();
  if (want("attention")) bench_attention();
  if (want("attention_kv_heads")) bench_attention_kv_heads();
  if (want("attention_batch")) bench_attention_batch();
  if (std::find(only.begin(), only.end(), "attention_trace") != only.end()) bench_attention_trace();
  if (std::find(only.begin(), only.end(), "chain_trigger") != only.end()) {
    bench_layer_chain(1, false, 1, 8192, true);
    bench_layer_chain(6, false, 1, 8192, true);
  }
  if (want("layer_chain")) {
    bench_layer_chain(1, false);
    bench_layer_chain(6, true);
    bench_layer_chain(16, true);  // the 16-row slowdown under PDL (docs/calibration.md)
    // The 16-row chain again with the m > 8 GEMVs on the refilled ring and PDL-launched.
    auto& gt = detail::gemv_tuning();
    const detail::GemvTuning saved = gt;
    gt.large_m_stages = 2;
    gt.pdl_max_rows = 16;
    std::printf("layer chain m=16 with GemvTuning large_m_stages 2, pdl_max_rows 16:\n");
    bench_layer_chain(16, false);
    // The engine's batched decode (16 requests of one token at ctx 192, the shape of
    // twinstep_pdl_rows_bench, where PDL-launched GEMVs of more than 8 rows slow the step): the
    // default tuning, then PDL at every row count (register path, refilled ring), with the
    // per-launcher diagnostics; 8 requests for reference.
    gt = saved;
    bench_layer_chain(8, false, 8, 192);
    bench_layer_chain(16, true, 16, 192);
    gt.pdl_max_rows = 16;
    std::printf("layer chain 16 requests with GemvTuning pdl_max_rows 16:\n");
    bench_layer_chain(16, true, 16, 192);
    gt.large_m_stages = 2;
    std::printf("layer chain 16 requests with GemvTuning large_m_stages 2, pdl_max_rows 16:\n");
    bench_layer_chain(16, true, 16, 192);
    gt = saved;
  }
  if (want("moe")) bench_moe();
  if (want("lm_head")) bench_lm_head();

  if (!out_path.empty()) {
    std::time_t now = std::time(nullptr);
    char date[64];
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) {
      std::perror(out_path.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"command\": \"%s\",\n  \"commit\": \"%s\",\n  \"gpu\": \"%s\",\n  "
                 "\"date\": \"%s\",\n  \"rows\": [\n",
                 command.c_str(), commit_id(commit).c_str(), prop.name, date);
    for (size_t i = 0; i < g_rows.size(); ++i)
      std::fprintf(f, "    %s%s\n", g_rows[i].json().c_str(), i + 1 < g_rows.size() ? "," : "");
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", out_path.c_str());
  }
  CUBLAS_CHECK(cublasDestroy(cublas));
  return 0;
}
