// A decode step's MLP -- gate|up with gelu(gate) * up, then down -- as ONE persistent launch
// (MUSER_DOT_CPP=mlp), for one question: do weights that are already in shared memory when a
// stage's input arrives beat a launch boundary?  (The fourteenth session's Triton MLP half
// waited on a counter *and then* streamed its weights: it lost.)
//
//   CTA c (grid G = max(gate|up items, down items), all resident at once -- the host checks):
//
//     copy_slab(gate|up item c) ─┐ copy_slab(down item c) ─┐        (before the PDL wait:
//     griddepcontrol.wait        │                         │         no input needed)
//     x ──► sums ──► act[:, c R..) ──► arrive ──► launch_dependents
//                                      wait until all G arrived ──► act rows ──► sums ──► y
//
// Each stage is gemv_mma.cu's slab kernel for that projection (slab.cuh: the same copies,
// MMA steps and endings), so act is dot_rows(x, wgu, glu, gelu)'s bits and y is
// dot_rows(act, wd)'s.  Whole-K projections only (no split-K pieces), bf16 weights.
//
// The grid barrier: a 64-bit counter in global memory, never reset -- every launch adds G, and
// a CTA that drew `old` waits for (old / G + 1) * G (launches on one stream never overlap
// past their arrivals: the next one waits in griddepcontrol.wait for the launches before it).
// launch_dependents only after a CTA has arrived: when the next kernel starts, every CTA of
// this one has been resident, so none of them can be kept off an SM by a kernel that spins
// waiting for this one (no deadlock).  The writes of act are published cooperative-groups
// style (__syncthreads, __threadfence, atomicAdd; the reader: spin, __threadfence,
// __syncthreads) and read past the L1 (ld.global.cg).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "slab.cuh"

namespace {

// shared memory: [0, 128) mbarriers: 4 gate|up quarters, x, 4 down quarters | gate|up slab
// (2R rows of 2K + 16 bytes) | down slab (R rows of 2I + 16) | x rows (B of 2K + 16) | act
// rows (B of 2I + 16)
__host__ __device__ inline size_t chain_smem(int R, int B, int K, int I) {
  return 128 + (size_t)(2 * R + B) * (2 * K + 16) + (size_t)(R + B) * (2 * I + 16);
}

template <int WARPS, bool PDL>
__global__ void __launch_bounds__(WARPS * 32)
    mlp_chain(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ wgu,
              const __nv_bfloat16* __restrict__ wd, __nv_bfloat16* act,
              __nv_bfloat16* __restrict__ y, unsigned long long* counter, int B, int K, int I,
              int H) {
  constexpr int R = 8 * WARPS, THREADS = 32 * WARPS;   // one n8 tile a warp
  extern __shared__ __align__(128) unsigned char smem[];
  const int ws1 = 2 * K + 16, ws2 = 2 * I + 16;        // bytes a shared row, as gemv_kernel's
  const uint32_t bars = smem_u32(smem), xbar = bars + 8 * CHUNKS, dbar = xbar + 8;
  const uint32_t gsm = 128, dsm = gsm + 2 * R * ws1, xsm = dsm + R * ws2, asm_ = xsm + B * ws1;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * R;
  const bool up = n0 < I, down = n0 < H;                // this CTA's items
  const int rows1 = up ? min(R, I - n0) : 0, rows2 = down ? min(R, H - n0) : 0;
  const int kc1 = K / CHUNKS, kc2 = I / CHUNKS;
  unsigned long long target = 0;                       // thread 0's: the barrier's count

  if (tid == 0) {
    for (int c = 0; c < 2 * CHUNKS + 1; ++c) mbar_init(bars + 8 * c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < CHUNKS; ++c) {
      if (up) mbar_expect(bars + 8 * c, 2 * rows1 * kc1 * 2);
      if (down) mbar_expect(dbar + 8 * c, rows2 * kc2 * 2);
    }
    if (up) mbar_expect(xbar, B * K * 2);
  }
  __syncthreads();
  if (up) copy_slab<2, R, 2, THREADS>(bars + gsm, bars, ws1, wgu, I, K, n0, rows1, 0, kc1);
  if (down) copy_slab<1, R, 2, THREADS>(bars + dsm, dbar, ws2, wd, H, I, n0, rows2, 0, kc2);
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");   // x: the kernel before's
  if (up) {
    if (tid < B) bulk_copy(bars + xsm + tid * ws1, x + (size_t)tid * K, K * 2, xbar);
    mbar_wait(xbar, 0);
    float acc[2][1][4];
    slab_sums<2, 1, false, R>(acc, smem, bars, xsm, ws1, gsm, ws1, B, kc1);
    store_tile<2, 1, GLU, false>(acc, act, nullptr, B, I, n0 + warp * 8, 0, g, t);
  }
  __syncthreads();                                      // this CTA's act columns stored
  if (tid == 0) {
    __threadfence();
    const unsigned long long old = atomicAdd(counter, 1ull);
    target = (old / gridDim.x + 1) * gridDim.x;
  }
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (!down) return;
  if (tid == 0) {
    const volatile unsigned long long* c = counter;
    for (uint32_t polls = 0; *c < target; ++polls)
      if (polls == (1u << 30)) __trap();               // seconds: a bug, not a wait
    __threadfence();
  }
  __syncthreads();                                      // every CTA's act stored and visible
  for (int i = tid; i < B * (I / 8); i += THREADS) {    // act rows: 16 bytes a thread, past L1
    const int b = i / (I / 8), j = i % (I / 8);
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(act + (size_t)b * I) + j);
    *reinterpret_cast<uint4*>(smem + asm_ + b * ws2 + 16 * j) = v;
  }
  __syncthreads();
  float acc[1][1][4];
  slab_sums<1, 1, false, R>(acc, smem, dbar, asm_, ws2, dsm, ws2, B, kc2);
  store_tile<1, 1, PLAIN, false>(acc, y, nullptr, B, H, n0 + warp * 8, 0, g, t);
}

template <int WARPS, bool PDL>
int launch(const void* x, const void* wgu, const void* wd, void* act, void* y, void* counter,
           int B, int K, int I, int H, cudaStream_t stream) {
  constexpr int R = 8 * WARPS;
  const size_t smem = chain_smem(R, B, K, I);
  if (smem > 227 * 1024) return -2;
  auto* kern = mlp_chain<WARPS, PDL>;
  static size_t raised = 0;                             // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    raised = smem;
  }
  const int grid = (max(I, H) + R - 1) / R;
  int dev = 0, sms = 0, per_sm = 0;                     // the spin barrier needs every CTA
  cudaGetDevice(&dev);                                  // resident at once
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 32 * WARPS, smem);
  if (e != cudaSuccess) return (int)e;
  if (grid > per_sm * sms) return -3;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(32 * WARPS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, kern, (const __nv_bfloat16*)x,
                                 (const __nv_bfloat16*)wgu, (const __nv_bfloat16*)wd,
                                 (__nv_bfloat16*)act, (__nv_bfloat16*)y,
                                 (unsigned long long*)counter, B, K, I, H);
}

}  // namespace

// y = dot_rows(dot_rows(x, wgu, glu, gelu), wd): x bf16 [B, K], wgu bf16 [2I, K] (gate rows,
// then up rows), wd bf16 [H, I]; act bf16 [B, I] (gate|up's output, a scratch the launch
// fills), y bf16 [B, H]; counter: one uint64 in device memory (zero at first, then only this
// kernel's: every launch on a stream may share it).  warps: 1, 2 or 4 (R = 8 warps columns a
// CTA).  0 on success; -1 a shape it does not take, -2 too much shared memory, -3 the grid
// cannot be resident at once (the barrier would deadlock), else a cudaError_t.
extern "C" int mlp_chain_launch(const void* x, const void* wgu, const void* wd, void* act,
                                void* y, void* counter, int B, int K, int I, int H, int warps,
                                int pdl, void* stream) {
  if (B < 1 || B > 16 || K % 64 || I % 64 || H % 8 || K <= 0 || I <= 0 || H <= 0) return -1;
  cudaStream_t s = (cudaStream_t)stream;
#define MUSER_CASE(W)                                                        \
  case W:                                                                    \
    return pdl ? launch<W, true>(x, wgu, wd, act, y, counter, B, K, I, H, s) \
               : launch<W, false>(x, wgu, wd, act, y, counter, B, K, I, H, s);
  switch (warps) {
    MUSER_CASE(1)
    MUSER_CASE(2)
    MUSER_CASE(4)
    default: return -1;
  }
#undef MUSER_CASE
}
