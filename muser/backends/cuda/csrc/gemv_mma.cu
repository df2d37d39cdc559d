// A decode projection in CUDA C++, for one question (benchmarks/cpp_gemv_probe.py): can a
// hand-written kernel reproduce dot_rows' decode tile bit for bit, and is it faster?
//
// y[b, n] = sum_k x[b, k] * w[n, k] for B <= 16 rows (bf16 in, float32 sums), the sum of each
// output the k16 MMA steps in order from zero -- dot_rows' arithmetic (piece_dot: acc =
// mma(x[:, 16s:16s+16], w[n, 16s:16s+16], acc) for s = 0, 1, ..., with the operands in
// mma.sync's own fragment layout, logical k = 16 s + slot: Triton's kWidth 2).  Three endings,
// dot_rows' own:
//
//   PLAIN  the sums rounded to bf16 (qkv, o, an unsplit down, the head);
//   GLU    gelu_tanh(gate) * up (gate|up: w is [2N, K], up rows N..2N-1), the epilogue in the
//          very instructions Triton emits for triton_dot_epilogue._act_up (its sm_90 PTX,
//          transcribed below: .rn multiplies and adds, ex2.approx, div.full);
//   SPLIT  each split-K piece's float32 sums, [pieces, B, N] -- dot_rows(defer=True)'s
//          Pieces.part, which the add+norm after it sums (down on the 1B: 1,024-key pieces).
//
// What differs from the Triton tile is only how the bytes arrive:
//
//   * a CTA owns R = 8 * NT * WARPS weight rows (output columns; GLU: and their up rows) over
//     its piece of K, and asks for all of them at once: one bulk copy (cp.async.bulk, the copy
//     engine) per row and quarter of the piece, four mbarriers -- the MMAs of quarter c start
//     when quarter c has landed;
//   * rows sit in shared memory 2 * KS + 16 bytes apart, so the fragment reads (lane = 4 g + t
//     reads row g, word t) hit 32 banks: KS a multiple of 64 keeps the 16 bytes the only skew;
//   * x's B rows (the piece's keys) arrive the same way; the MMA's rows B..15 are zeros;
//   * PDL (programmatic dependent launch): the weights do not depend on the kernel before, so
//     their copies are asked for before `griddepcontrol.wait`; x's after it -- a launch's
//     weights stream in while the launch before it still computes (the megakernels' "loaders
//     ahead", at launch grain, by the copy engine: no registers or threads held for it).
//
//   warp w, n8 tile j: rows  w*8*NT + 8 j + g  (g = lane / 4), k pairs 2t, 2t + 1 and +8
//   (t = lane % 4) -- mma.m16n8k16.row.col's B fragment; A: x rows g and g + 8, same k.
//
// Not product code: no int8 weights, no bias, no widened or picking head.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int CHUNKS = 4;
enum Mode { PLAIN = 0, GLU = 1, SPLIT = 2 };

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

// Waits for the barrier's phase `phase` to complete.  Bounded: a copy that never lands (a bug
// in the byte counts) traps -- a launch error the caller sees -- instead of hanging the GPU;
// 2^26 polls of try_wait (each suspends a while) is seconds, far past any real copy.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t phase) {
  uint32_t done = 0;
  for (uint32_t polls = 0; !done; ++polls) {
    if (polls == (1u << 26)) __trap();
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
  }
}

__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// A shared-memory word by an ordinary load: the compiler may schedule it ahead (the next step's
// fragments while this step's MMA runs) but not above mbar_wait, whose "memory" clobber orders it.
__device__ __forceinline__ uint32_t lds32(const unsigned char* smem, uint32_t off) {
  return *reinterpret_cast<const uint32_t*>(smem + off);
}

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
  asm(   // registers only, no side effect: not volatile, so the compiler may interleave steps
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float div_full(float a, float b) {
  float y;
  asm("div.full.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}

__device__ __forceinline__ float bf16_round(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

// _act_up(g, u, bf16, GELU=True) as Triton 3.6 compiles it for sm_90 (the PTX of
// sm90_ptx.py's "dot_rows gate|up 16-row decode tile"), instruction for instruction:
//   gf = bf16(g); t = (gf * 0.044715 * gf) fma gf, * 0.7978846; h = gf * 0.5
//   s = 1 / (ex2((-2 t) * log2 e) + 1)            (tl.sigmoid(2 t): div.full)
//   a = h * ((s fma 2, -1) + 1);   out = bf16(bf16(a) * bf16(u))   (mul.bf16x2)
__device__ __forceinline__ __nv_bfloat16 gelu_up(float g, float u) {
  const float gf = bf16_round(g);
  const float p = __fmul_rn(__fmul_rn(gf, 0.044714998453855515f), gf);
  const float t = __fmul_rn(__fmaf_rn(p, gf, gf), 0.79788458347320557f);
  const float h = __fmul_rn(gf, 0.5f);
  const float m = __fmaf_rn(t, -2.0f, 0.0f);
  const float e = ex2_approx(__fmul_rn(m, 1.4426950216293335f));
  const float sg = div_full(1.0f, __fadd_rn(e, 1.0f));
  const float a = __fmul_rn(h, __fadd_rn(__fmaf_rn(sg, 2.0f, -1.0f), 1.0f));
  return __hmul(__float2bfloat16_rn(a), __float2bfloat16_rn(u));
}

template <int WARPS, int NT, bool PDL, int MODE>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_mma(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
             void* __restrict__ out, int B, int N, int K, int KS) {
  constexpr int R = 8 * NT * WARPS;                 // output columns a CTA
  constexpr int HALVES = MODE == GLU ? 2 : 1;       // GLU: gate rows, then up rows
  constexpr int THREADS = 32 * WARPS;
  extern __shared__ __align__(128) unsigned char smem[];
  const int stride = 2 * KS + 16;                   // bytes a shared row
  const uint32_t bars = smem_u32(smem);             // CHUNKS + 1 mbarriers, 8 bytes each
  const uint32_t wsm = 64;                          // byte offsets: HALVES * R weight rows,
  const uint32_t xsm = wsm + HALVES * R * stride;   // then B rows of x
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * R, piece = blockIdx.y;
  const int k0 = piece * KS, klen = min(KS, K - k0);
  const int rows = min(R, N - n0);
  const int kc = klen / CHUNKS;                     // keys a quarter (a multiple of 16)

  if (tid == 0) {
    for (int c = 0; c <= CHUNKS; ++c) mbar_init(bars + 8 * c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < CHUNKS; ++c) mbar_expect(bars + 8 * c, HALVES * rows * kc * 2);
    mbar_expect(bars + 8 * CHUNKS, B * klen * 2);
  }
  __syncthreads();
  // HALVES * R rows x CHUNKS quarters, quarter-major: quarter 0 of every row first
  for (int i = tid; i < HALVES * R * CHUNKS; i += THREADS) {
    const int r = i % (HALVES * R), c = i / (HALVES * R);
    const int half = r / R, rr = r % R;
    if (rr < rows)
      bulk_copy(bars + wsm + r * stride + c * kc * 2,
                w + (size_t)(half * N + n0 + rr) * K + k0 + c * kc, kc * 2, bars + 8 * c);
  }
  if (PDL) {   // x is the kernel before's output: wait for it, then let the next one launch
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (tid < B)
    bulk_copy(bars + xsm + tid * stride, x + (size_t)tid * K + k0, klen * 2, bars + 8 * CHUNKS);

  float acc[HALVES][NT][4];
#pragma unroll
  for (int h = 0; h < HALVES; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
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
      const uint32_t a0 = ra ? lds32(smem, xa + o) : 0u, a1 = rb ? lds32(smem, xb + o) : 0u;
      const uint32_t a2 = ra ? lds32(smem, xa + o + 16) : 0u;
      const uint32_t a3 = rb ? lds32(smem, xb + o + 16) : 0u;
#pragma unroll
      for (int h = 0; h < HALVES; ++h)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t p = wr + (h * R + j * 8) * stride + o;
          mma16816(acc[h][j], a0, a1, a2, a3, lds32(smem, p), lds32(smem, p + 16));
        }
    }
  }
  // D fragment: d0, d1 row g, columns 2t, 2t + 1 of the n8 tile; d2, d3 row g + 8
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = n0 + warp * 8 * NT + j * 8 + 2 * t;
    if (col >= N) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = g + 8 * half;
      if (row >= B) continue;
      const float v0 = acc[0][j][2 * half], v1 = acc[0][j][2 * half + 1];
      if (MODE == SPLIT) {
        float2* p = reinterpret_cast<float2*>(
            static_cast<float*>(out) + ((size_t)piece * B + row) * N + col);
        *p = make_float2(v0, v1);
      } else {
        __nv_bfloat162 r;
        if (MODE == GLU) {
          r.x = gelu_up(v0, acc[HALVES - 1][j][2 * half]);
          r.y = gelu_up(v1, acc[HALVES - 1][j][2 * half + 1]);
        } else {
          r = __floats2bfloat162_rn(v0, v1);
        }
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + (size_t)row * N +
                                           col) = r;
      }
    }
  }
}

template <int WARPS, int NT, bool PDL, int MODE>
int launch(const void* x, const void* w, void* y, int B, int N, int K, int KS,
           cudaStream_t stream) {
  constexpr int R = 8 * NT * WARPS;
  constexpr int HALVES = MODE == GLU ? 2 : 1;
  const size_t smem = 64 + (size_t)(HALVES * R + B) * (2 * KS + 16);
  if (smem > 227 * 1024) return -2;
  static size_t raised = 0;                         // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(gemv_mma<WARPS, NT, PDL, MODE>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return (int)e;
    raised = smem;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((N + R - 1) / R, (K + KS - 1) / KS);
  cfg.blockDim = dim3(32 * WARPS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, gemv_mma<WARPS, NT, PDL, MODE>, (const __nv_bfloat16*)x,
                                 (const __nv_bfloat16*)w, y, B, N, K, KS);
}

template <int WARPS, int NT, int MODE>
int launch_pdl(const void* x, const void* w, void* y, int B, int N, int K, int KS, int pdl,
               cudaStream_t s) {
  return pdl ? launch<WARPS, NT, true, MODE>(x, w, y, B, N, K, KS, s)
             : launch<WARPS, NT, false, MODE>(x, w, y, B, N, K, KS, s);
}

template <int MODE>
int launch_mode(const void* x, const void* w, void* y, int B, int N, int K, int KS, int warps,
                int nt, int pdl, cudaStream_t s) {
  switch (warps * 10 + nt) {
    case 11: return launch_pdl<1, 1, MODE>(x, w, y, B, N, K, KS, pdl, s);
    case 21: return launch_pdl<2, 1, MODE>(x, w, y, B, N, K, KS, pdl, s);
    case 41: return launch_pdl<4, 1, MODE>(x, w, y, B, N, K, KS, pdl, s);
    case 12: return launch_pdl<1, 2, MODE>(x, w, y, B, N, K, KS, pdl, s);
    case 22: return launch_pdl<2, 2, MODE>(x, w, y, B, N, K, KS, pdl, s);
    default: return -1;
  }
}

}  // namespace

// mode 0 PLAIN (y bf16 [B, N]), 1 GLU (w [2N, K], y bf16 [B, N]), 2 SPLIT (y float32
// [pieces, B, N]); ks: keys a split-K piece (K: none).  0 on success; -1 a shape it does not
// take, -2 too much shared memory, else a cudaError_t.
extern "C" int gemv_mma_launch(const void* x, const void* w, void* y, int B, int N, int K,
                               int ks, int mode, int warps, int nt, int pdl, void* stream) {
  if (ks <= 0 || ks > K || ks % 64 || (K % ks) % 64 || N % 8 || B < 1 || B > 16) return -1;
  cudaStream_t s = (cudaStream_t)stream;
  switch (mode) {
    case PLAIN: return launch_mode<PLAIN>(x, w, y, B, N, K, ks, warps, nt, pdl, s);
    case GLU: return launch_mode<GLU>(x, w, y, B, N, K, ks, warps, nt, pdl, s);
    case SPLIT: return launch_mode<SPLIT>(x, w, y, B, N, K, ks, warps, nt, pdl, s);
    default: return -1;
  }
}
