// Probe for compute-sanitizer synccheck (scripts/gpu_sanitize.sh runs it under the tool): does
// synccheck judge a block barrier correctly in a kernel that runs inside a conditional IF node of
// a CUDA graph? The kernel is the speculative draft's row norm (runtime/spec_ops.cu norm_into: a
// strided sum of squares, a warp shuffle reduction, __syncthreads, a block sum), launched seven
// ways: eagerly, as a node of a captured graph, and in the bodies of three conditional IF nodes
// captured the way Engine::draft_forward captures its early-exit steps
// (cudaStreamBeginCaptureToGraph on a side stream, a row-copy kernel with griddepcontrol first;
// uploaded, then replayed with some steps' bodies skipped), those bodies ending with a one-thread-
// per-row kernel whose spare lanes return at once, with the same kernel launched exactly as wide
// as the rows, with a whole warp that exits together, and with it launched as wide as the norm.
// Every output that the tool lets finish is checked against a CPU reference (kinds 0-2 here;
// under the tool's kill a kind ends with a CUDA error, exit 2), so a synccheck report in
// norm_kernel<K> and none in norm_kernel<0> or <1> is the tool's, not the kernel's.
//   conditional_synccheck_probe [KIND]   prints one line per launch kind (all, or KIND 0..6), exits
//                                        1 on a wrong output
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

constexpr int kThreads = 256;
constexpr int kHidden = 512;  // the tiny runtime model's hidden size
constexpr int kRows = 2;
constexpr float kEps = 1e-5f;

// 3 to 6: the same IF bodies with a third kernel after the norm, one thread per row as the
// draft's draft_step_commit_kernel: launched 32 wide with the lanes past the rows returning at
// once (3), launched exactly kRows wide (4), launched 32 wide with every lane running to one
// common exit (5), or launched as wide as the norm's blocks (kThreads, 6). Measured at d96bb4c
// (compute-sanitizer 2025.3.1): 0 reports for kinds 0-2; 512 for each of 3-6, every thread of
// both blocks of a later body's norm "divergent", and the tool kills it. Whatever the third
// kernel's shape, a body of three kernels makes the tool misjudge the next body's barrier: the
// tool's, not the kernels' (the same norm is clean in kinds 0-2, and the added kernel has no
// barrier).
enum Launch : int {
  kEager = 0,
  kGraphNode = 1,
  kConditionalBody = 2,
  kBodyAfterLaneExit = 3,
  kBodyAfterExactWidth = 4,
  kBodyAfterWholeWarp = 5,
  kBodyAfterNormWidth = 6,
  kLaunchKinds = 7
};

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w, one block per row, warp_sums shared with the
// caller's next pass (spec_ops.cu norm_into, line for line).
__device__ void norm_pass(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out,
                          int hidden, float* warp_sums) {
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += kThreads) {
    const float v = __bfloat162float(x[i]);
    sum_sq += v * v;
  }
  for (int offset = 16; offset > 0; offset /= 2)
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum_sq;
  __syncthreads();
  float total = 0.0f;
  for (int k = 0; k < kThreads / 32; ++k) total += warp_sums[k];
  __syncthreads();  // warp_sums is reused by the next pass
  const float inv_rms = rsqrtf(total / hidden + kEps);
  for (int i = threadIdx.x; i < hidden; i += kThreads)
    out[i] = __float2bfloat16(__bfloat162float(x[i]) * inv_rms * __bfloat162float(w[i]));
}

// Two passes per block, as concat_norm_kernel: row r normalised into out[r] twice over (the
// template argument names the launch kind in the tool's reports).
template <int L>
__global__ void __launch_bounds__(kThreads)
    norm_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out, int hidden) {
  __shared__ float warp_sums[kThreads / 32];
  const size_t r = blockIdx.x;
  norm_pass(x + r * hidden, w, out + r * hidden, hidden, warp_sums);
  norm_pass(x + r * hidden, w, out + r * hidden, hidden, warp_sums);
}

// dst[r] = src[r], one block per row, with the griddepcontrol instructions every runtime kernel
// carries (the draft step's first kernel, embedding_gather, before the norm).
__global__ void copy_rows_kernel(const __nv_bfloat16* src, __nv_bfloat16* dst, int hidden) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    dst[size_t(blockIdx.x) * hidden + i] = src[size_t(blockIdx.x) * hidden + i];
}

// flags[r] = r + 1 for r < rows, one thread per row; lanes past `rows` return at once.
__global__ void row_flags_kernel(int* flags, int rows) {
  const int r = threadIdx.x;
  if (r >= rows) return;
  flags[r] = r + 1;
}

// The same, every lane of the warp reaching the end (the guarded store, then __syncwarp).
__global__ void row_flags_whole_warp_kernel(int* flags, int rows) {
  const int r = threadIdx.x;
  if (r < rows) flags[r] = r + 1;
  __syncwarp();
}

// The IF node of `step` runs when the step's bit of *pattern is set (the host rewrites the pattern
// before each replay, as the engine's draft rows stop at different steps).
__global__ void set_condition_kernel(cudaGraphConditionalHandle handle, const int* pattern,
                                     int step) {
  cudaGraphSetConditional(handle, (*pattern >> step) & 1);
}

}  // namespace

int main(int argc, char** argv) {
  // One launch kind (argv[1]) or all of them: a kind the tool kills ends the process, so
  // scripts/gpu_sanitize.sh runs each in a process of its own.
  const int only = argc > 1 ? std::atoi(argv[1]) : -1;
  if (argc > 1 && (only < 0 || only >= kLaunchKinds)) {
    std::fprintf(stderr, "usage: conditional_synccheck_probe [KIND 0..%d]\n", kLaunchKinds - 1);
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("conditional_synccheck_probe: no CUDA device\n");
    return 0;
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<__nv_bfloat16> x(size_t(kRows) * kHidden), w(kHidden);
  for (auto& v : x) v = __float2bfloat16(dist(rng));
  for (auto& v : w) v = __float2bfloat16(dist(rng));
  std::vector<float> ref(x.size());
  for (int r = 0; r < kRows; ++r) {
    double sum_sq = 0;
    for (int i = 0; i < kHidden; ++i) {
      const double v = __bfloat162float(x[size_t(r) * kHidden + i]);
      sum_sq += v * v;
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / kHidden + kEps);
    for (int i = 0; i < kHidden; ++i)
      ref[size_t(r) * kHidden + i] =
          float(__bfloat162float(x[size_t(r) * kHidden + i]) * inv_rms * __bfloat162float(w[i]));
  }
  __nv_bfloat16 *dx, *dw, *dout, *dcopy;
  check(cudaMalloc(&dx, x.size() * 2), "cudaMalloc x");
  check(cudaMalloc(&dcopy, x.size() * 2), "cudaMalloc copy");
  int* dpattern = nullptr;
  check(cudaMalloc(&dpattern, sizeof(int)), "cudaMalloc pattern");
  check(cudaMalloc(&dw, w.size() * 2), "cudaMalloc w");
  check(cudaMalloc(&dout, x.size() * 2), "cudaMalloc out");
  check(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "upload x");
  check(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "upload w");
  cudaStream_t s, side;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "side stream");

  bool ok = true;
  int* dflags = nullptr;
  check(cudaMalloc(&dflags, 32 * sizeof(int)), "cudaMalloc flags");
  for (int kind = 0; kind < kLaunchKinds; ++kind) {
    if (only >= 0 && kind != only) continue;
    check(cudaMemset(dout, 0, x.size() * 2), "memset out");
    if (kind == kEager) {
      norm_kernel<kEager><<<kRows, kThreads, 0, s>>>(dx, dw, dout, kHidden);
      check(cudaGetLastError(), "eager launch");
    } else {
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "begin capture");
      if (kind == kGraphNode) {
        norm_kernel<kGraphNode><<<kRows, kThreads, 0, s>>>(dx, dw, dout, kHidden);
        check(cudaGetLastError(), "graph node launch");
      } else {
        // Three IF nodes in sequence, each body a row copy then the norm (the draft's early-exit
        // steps: each step j >= 1 is one IF node whose body starts with embedding_gather).
        for (int step = 0; step < 3; ++step) {
          cudaStreamCaptureStatus status;
          cudaGraph_t capturing = nullptr;
          const cudaGraphNode_t* deps = nullptr;
          size_t num_deps = 0;
          check(
              cudaStreamGetCaptureInfo(s, &status, nullptr, &capturing, &deps, nullptr, &num_deps),
              "capture info");
          cudaGraphConditionalHandle handle = 0;
          check(cudaGraphConditionalHandleCreate(&handle, capturing, 0, cudaGraphCondAssignDefault),
                "conditional handle");
          set_condition_kernel<<<1, 1, 0, s>>>(handle, dpattern, step);
          check(cudaGetLastError(), "set condition launch");
          check(
              cudaStreamGetCaptureInfo(s, &status, nullptr, &capturing, &deps, nullptr, &num_deps),
              "capture info");
          cudaGraphNodeParams params = {};
          params.type = cudaGraphNodeTypeConditional;
          params.conditional.handle = handle;
          params.conditional.type = cudaGraphCondTypeIf;
          params.conditional.size = 1;
          cudaGraphNode_t node = nullptr;
          check(cudaGraphAddNode(&node, capturing, deps, nullptr, num_deps, &params),
                "add IF node");
          check(cudaStreamUpdateCaptureDependencies(s, &node, nullptr, 1,
                                                    cudaStreamSetCaptureDependencies),
                "update capture dependencies");
          check(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[0], nullptr,
                                              nullptr, 0, cudaStreamCaptureModeThreadLocal),
                "begin body capture");
          copy_rows_kernel<<<kRows, kThreads, 0, side>>>(dx, dcopy, kHidden);
          check(cudaGetLastError(), "body copy launch");
          if (kind == kConditionalBody) {
            norm_kernel<kConditionalBody><<<kRows, kThreads, 0, side>>>(dcopy, dw, dout, kHidden);
          } else if (kind == kBodyAfterLaneExit) {
            norm_kernel<kBodyAfterLaneExit><<<kRows, kThreads, 0, side>>>(dcopy, dw, dout, kHidden);
            row_flags_kernel<<<1, 32, 0, side>>>(dflags, kRows);
          } else if (kind == kBodyAfterExactWidth) {
            norm_kernel<kBodyAfterExactWidth>
                <<<kRows, kThreads, 0, side>>>(dcopy, dw, dout, kHidden);
            row_flags_kernel<<<1, kRows, 0, side>>>(dflags, kRows);
          } else if (kind == kBodyAfterWholeWarp) {
            norm_kernel<kBodyAfterWholeWarp>
                <<<kRows, kThreads, 0, side>>>(dcopy, dw, dout, kHidden);
            row_flags_whole_warp_kernel<<<1, 32, 0, side>>>(dflags, kRows);
          } else {
            norm_kernel<kBodyAfterNormWidth>
                <<<kRows, kThreads, 0, side>>>(dcopy, dw, dout, kHidden);
            row_flags_kernel<<<1, kThreads, 0, side>>>(dflags, kRows);
          }
          check(cudaGetLastError(), "body launch");
          cudaGraph_t body = nullptr;
          check(cudaStreamEndCapture(side, &body), "end body capture");
        }
      }
      check(cudaStreamEndCapture(s, &graph), "end capture");
      cudaGraphExec_t exec = nullptr;
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      check(cudaGraphUpload(exec, s), "upload");  // as the engine does
      // Replays with steps skipped (bodies not run), then one with every step, whose output is
      // checked: patterns 0b111, 0b001, 0b000, 0b011, 0b111.
      for (int pattern : {7, 1, 0, 3, 7}) {
        check(cudaMemcpyAsync(dpattern, &pattern, sizeof(int), cudaMemcpyHostToDevice, s),
              "pattern upload");
        check(cudaStreamSynchronize(s), "synchronize pattern");
        check(cudaGraphLaunch(exec, s), "graph launch");
      }
      check(cudaStreamSynchronize(s), "synchronize graph");
      check(cudaGraphExecDestroy(exec), "destroy exec");
      check(cudaGraphDestroy(graph), "destroy graph");
    }
    check(cudaStreamSynchronize(s), "synchronize");
    std::vector<__nv_bfloat16> out(x.size());
    check(cudaMemcpy(out.data(), dout, out.size() * 2, cudaMemcpyDeviceToHost), "download out");
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i)
      worst = std::fmax(worst,
                        std::fabs(__bfloat162float(out[i]) - ref[i]) / (std::fabs(ref[i]) + 1e-2));
    const bool good = worst < 1e-2;  // bf16 output rounding
    std::printf(
        "conditional_synccheck_probe launch %d (%s): output %s the CPU reference (worst relative "
        "error %.2e); synccheck reports for it name norm_kernel<%d>\n",
        kind,
        kind == kEager                 ? "eager"
        : kind == kGraphNode           ? "graph node"
        : kind == kConditionalBody     ? "conditional IF body"
        : kind == kBodyAfterLaneExit   ? "IF body after a body ending in lanes that returned early"
        : kind == kBodyAfterExactWidth ? "IF body after a body ending in an exact-width kernel"
        : kind == kBodyAfterWholeWarp
            ? "IF body after a body ending in a whole warp exiting together"
            : "IF body after a body ending in a kernel of the norm's width",
        good ? "matches" : "DOES NOT match", worst, kind);
    ok = ok && good;
  }
  check(cudaStreamDestroy(s), "destroy stream");
  check(cudaStreamDestroy(side), "destroy side stream");
  check(cudaFree(dx), "cudaFree");
  check(cudaFree(dw), "cudaFree");
  check(cudaFree(dout), "cudaFree");
  check(cudaFree(dcopy), "cudaFree");
  check(cudaFree(dpattern), "cudaFree");
  check(cudaFree(dflags), "cudaFree");
  return ok ? 0 : 1;
}
