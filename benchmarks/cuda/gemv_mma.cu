// A decode projection in CUDA C++, for one question (benchmarks/cpp_gemv_probe.py): can a
// hand-written kernel reproduce dot_rows' decode tile bit for bit, and is it faster?
//
// y[b, n] = sum_k x[b, k] * w[n, k] for B <= 16 rows (bf16 in and out, float32 sums), the sum
// of each output the k16 MMA steps in order from zero -- dot_rows' arithmetic (piece_dot:
// acc = mma(x[:, 16s:16s+16], w[n, 16s:16s+16], acc) for s = 0, 1, ..., with the operands in
// mma.sync's own fragment layout, logical k = 16 s + slot: Triton's kWidth 2).  What differs
// from the Triton tile is only how the bytes arrive:
//
//   * a CTA owns R = 8 * NT * WARPS weight rows (output columns) over the whole K, and asks
//     for all of them at once: one bulk copy (cp.async.bulk, the copy engine) per row and
//     K-quarter, four mbarriers -- the MMAs of quarter c start when quarter c has landed;
//   * rows sit in shared memory 2K + 16 bytes apart, so the fragment reads (lane = 4 g + t
//     reads row g, word t) hit 32 banks: K a multiple of 64 keeps the 16 bytes the only skew;
//   * x's B rows arrive the same way; the MMA's rows B..15 are zeros in registers.
//
//   warp w, n8 tile j: rows  w*8*NT + 8 j + g  (g = lane / 4), k pairs 2t, 2t + 1 and +8
//   (t = lane % 4) -- mma.m16n8k16.row.col's B fragment; A: x rows g and g + 8, same k.
//
//   * PDL (programmatic dependent launch): the weights do not depend on the kernel before, so
//     their copies are asked for before `griddepcontrol.wait`; x's after it -- a launch's
//     weights stream in while the launch before it still computes (the megakernels' "loaders
//     ahead", at launch grain, by the copy engine: no registers or threads held for it).
//
// Not product code: no split-K pieces, no act*up, no int8 weights.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int CHUNKS = 4;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile(
      "{\n\t.reg .b64 st;\n\t"
      "mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(bar),
      "r"(bytes)
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  } while (!done);
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int WARPS, int NT, bool PDL>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_mma(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
             __nv_bfloat16* __restrict__ y, int B, int N, int K) {
  constexpr int R = 8 * NT * WARPS;
  constexpr int THREADS = 32 * WARPS;
  extern __shared__ __align__(128) unsigned char smem[];
  const int stride = 2 * K + 16;                    // bytes a shared row
  const uint32_t bars = smem_u32(smem);             // CHUNKS + 1 mbarriers, 8 bytes each
  const uint32_t wsm = bars + 64;                   // R weight rows
  const uint32_t xsm = wsm + R * stride;            // B rows of x
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * R;
  const int rows = min(R, N - n0);
  const int kc = K / CHUNKS;                        // keys a quarter (a multiple of 16)

  if (tid == 0) {
    for (int c = 0; c <= CHUNKS; ++c) mbar_init(bars + 8 * c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < CHUNKS; ++c) mbar_expect(bars + 8 * c, rows * kc * 2);
    mbar_expect(bars + 8 * CHUNKS, B * K * 2);
  }
  __syncthreads();
  // R rows x CHUNKS quarters = NT copies a thread, quarter-major: quarter 0 of every row first
  for (int i = tid; i < R * CHUNKS; i += THREADS) {
    const int r = i % R, c = i / R;
    if (r < rows)
      bulk_copy(wsm + r * stride + c * kc * 2, w + (size_t)(n0 + r) * K + c * kc, kc * 2,
                bars + 8 * c);
  }
  if (PDL) {   // x is the kernel before's output: wait for it, then let the next one launch
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (tid < B) bulk_copy(xsm + tid * stride, x + (size_t)tid * K, K * 2, bars + 8 * CHUNKS);

  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  const bool ra = g < B, rb = g + 8 < B;
  const uint32_t xa = xsm + g * stride + 4 * t, xb = xa + 8 * stride;
  const uint32_t wr = wsm + (warp * 8 * NT + g) * stride + 4 * t;
  mbar_wait(bars + 8 * CHUNKS, 0);
  for (int c = 0; c < CHUNKS; ++c) {
    mbar_wait(bars + 8 * c, 0);
    const int s1 = (c + 1) * kc / 16;
#pragma unroll 4
    for (int s = c * kc / 16; s < s1; ++s) {
      const uint32_t o = 32 * s;                    // bytes: 16 keys a step
      const uint32_t a0 = ra ? lds32(xa + o) : 0u, a1 = rb ? lds32(xb + o) : 0u;
      const uint32_t a2 = ra ? lds32(xa + o + 16) : 0u, a3 = rb ? lds32(xb + o + 16) : 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t p = wr + j * 8 * stride + o;
        mma16816(acc[j], a0, a1, a2, a3, lds32(p), lds32(p + 16));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = n0 + warp * 8 * NT + j * 8 + 2 * t;
    if (col < N) {
      if (ra)
        *reinterpret_cast<__nv_bfloat162*>(y + (size_t)g * N + col) =
            __floats2bfloat162_rn(acc[j][0], acc[j][1]);
      if (rb)
        *reinterpret_cast<__nv_bfloat162*>(y + (size_t)(g + 8) * N + col) =
            __floats2bfloat162_rn(acc[j][2], acc[j][3]);
    }
  }
}

template <int WARPS, int NT, bool PDL>
int launch(const void* x, const void* w, void* y, int B, int N, int K, cudaStream_t stream) {
  constexpr int R = 8 * NT * WARPS;
  const size_t smem = 64 + (size_t)(R + B) * (2 * K + 16);
  if (smem > 227 * 1024) return -2;
  static size_t raised = 0;                         // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(gemv_mma<WARPS, NT, PDL>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    raised = smem;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + R - 1) / R);
  cfg.blockDim = dim3(32 * WARPS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, gemv_mma<WARPS, NT, PDL>, (const __nv_bfloat16*)x,
                                 (const __nv_bfloat16*)w, (__nv_bfloat16*)y, B, N, K);
}

}  // namespace

// 0 on success; -1 a shape it does not take, -2 too much shared memory, else a cudaError_t.
extern "C" int gemv_mma_launch(const void* x, const void* w, void* y, int B, int N, int K,
                               int warps, int nt, int pdl, void* stream) {
  if (K % 64 || N % 8 || B < 1 || B > 16) return -1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (warps * 100 + nt * 10 + (pdl != 0)) {
#define GEMV_CASE(W, T)                                      \
  case W * 100 + T * 10: return launch<W, T, false>(x, w, y, B, N, K, s); \
  case W * 100 + T * 10 + 1: return launch<W, T, true>(x, w, y, B, N, K, s);
    GEMV_CASE(1, 1) GEMV_CASE(2, 1) GEMV_CASE(4, 1) GEMV_CASE(1, 2) GEMV_CASE(2, 2)
    GEMV_CASE(4, 2)
#undef GEMV_CASE
    default: return -1;
  }
}
