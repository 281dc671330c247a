// Device-side helpers shared by the kernel sources (nvcc only, not part of the public API):
// the PDL-aware launcher, programmatic-dependent-launch hooks, tensor-core and copy primitives.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/common.h"
#include "kernels/tuning.h"

namespace twinstep::kernels::detail {

// Appends the carveout request of `percent` (default KernelTuning::carveout_percent; < 0: none)
// at attrs[n]; returns the new count.
inline unsigned add_carveout(cudaLaunchAttribute* attrs, unsigned n,
                             int percent = kernel_tuning().carveout_percent) {
  if (percent < 0) return n;
  attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  attrs[n].val.sharedMemCarveout = static_cast<unsigned>(percent);
  return n + 1;
}

// Launches `kernel` with cudaLaunchKernelEx; with pdl the launch carries
// cudaLaunchAttributeProgrammaticStreamSerialization, so its blocks may start while the previous
// kernel in the stream finishes (works inside stream capture). Checks the launch.
template <typename... KernelArgs, typename... Args>
void launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
            cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  config.attrs = attribute;
  config.numAttrs = add_carveout(attribute, 0);
  if (pdl) {
    attribute[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[config.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  TS_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
  TS_CUDA_CHECK(cudaGetLastError());
}

// PDL contract used by every kernel here: the prologue before pdl_wait() reads only data that the
// immediately preceding kernel does not write (weights, older KV tokens); pdl_wait() waits for the
// preceding grid to complete and flush; the trigger comes after the wait, so at most two kernels
// of a chain overlap and anything written two kernels back is complete before a prologue runs.
// Without the PDL launch attribute both calls return at once.
__device__ __forceinline__ void pdl_wait_and_trigger() {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
}

// Early trigger, for the small kernels that sit between two streaming kernels (norm, rope,
// attention combine): lets the next kernel launch (and run its weight/KV prologue) while this one
// still waits on its predecessor. Safe because every prologue here reads only data that no kernel
// of a decode step writes (weights, KV tokens older than the step, ctx_lens, request_base); the
// dependency wait of the next kernel still waits for this one, which waited for its predecessor.
__device__ __forceinline__ void pdl_trigger_then_wait() {
  cudaTriggerProgrammaticLaunchCompletion();
  cudaGridDependencySynchronize();
}

// Benchmark traces only: the global nanosecond timer (it ticks in 256 ns steps on the H200) and
// the SM this thread runs on.
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ unsigned sm_id() {
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

// The small kernels' dependency wait with the trigger placement `mode` (small_kernel_trigger_mode
// in tuning.h): 0 pdl_trigger_then_wait, 1 pdl_wait_and_trigger, 2 the wait alone (the dependent
// launches as this grid's blocks exit).
__device__ __forceinline__ void pdl_small_wait(int mode) {
  if (mode == 0)
    pdl_trigger_then_wait();
  else if (mode == 1)
    pdl_wait_and_trigger();
  else
    cudaGridDependencySynchronize();
}

// --- mbarrier and bulk-copy (TMA, plain sm_90) primitives -------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
// Orders this thread's earlier generic-proxy shared-memory accesses (seen through an mbarrier:
// the consumers' ldmatrix reads of a stage) before its later async-proxy ones (the bulk copy
// that refills the stage). The PTX memory model asks for it across proxies.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Bulk global->shared copy (bytes % 16 == 0, both addresses 16-byte aligned) that completes
// `bytes` of transaction count on `bar`.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, uint32_t bytes,
                                              uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// Arrives on `bar` once every cp.async this thread issued so far has landed (count pre-set at
// init).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}

// Four 8x8 b16 matrices from shared memory (lane l gives the address of row l % 8 of matrix l / 8).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_row_addr));
}

// D += A * B for one m16n8k16 bf16 tile, fp32 accumulate (PTX fragment layouts).
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weight and KV streams ask L2 for whole 128-byte lines (the .L2::128B prefetch size). A warp's
// mma fragment load touches 64 bytes of each of 8 rows, the other 64 bytes of those lines come
// one instruction later; without the hint L2 fetched them from HBM as separate halves. On an
// H200 (twinstep_kernels_bench --only access, 2 GiB of rows 8 KB long, results/h200/kernels.json):
// the GEMV's pattern by cp.async.cg 4.06-4.09 TB/s without the hint, 4.46 with it; by
// ld.global.nc.L1::no_allocate 4.12 and 4.31; the same bytes as row runs 4.54 (the floor 4.545).
// TWINSTEP_NO_L2_PREFETCH (the benchmark's before/after build) leaves the hint out.
#ifdef TWINSTEP_NO_L2_PREFETCH
#define TS_L2_PREFETCH ""
#else
#define TS_L2_PREFETCH ".L2::128B"
#endif

// 16-byte global load that bypasses L1 (weights and KV: read once per launch).
__device__ __forceinline__ uint4 load_stream_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate" TS_L2_PREFETCH ".v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// 16-byte global load through L1 (activations, re-read by neighbouring blocks).
__device__ __forceinline__ uint4 load_16(const void* ptr) {
  return __ldg(reinterpret_cast<const uint4*>(ptr));
}

// Asynchronous 16-byte global->shared copy (L2 prefetch as load_stream_16); src_bytes = 0 fills
// the 16 bytes with zeros.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global" TS_L2_PREFETCH " [%0], [%1], 16, %2;\n" ::"r"(s),
               "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Four 8x8 b16 matrices from shared memory, transposed (B fragments from a row-major [k][n] tile).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float2 unpack_bf16x2(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
}

}  // namespace twinstep::kernels::detail
