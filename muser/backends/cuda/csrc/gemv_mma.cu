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

#include "sm90.cuh"
#include "triton_math.cuh"

namespace {

constexpr int CHUNKS = 4;
enum Mode { PLAIN = 0, GLU = 1, SPLIT = 2 };

// Bytes of shared memory NORM stages its inputs in, after the x rows: w_post and w_next
// (float32 [K] each), h (bf16 [B, K]), d1 (bf16 [B, K], or float32 pieces [pieces, B, K]).
__host__ __device__ inline size_t norm_bytes(int B, int K, int pieces) {
  return (size_t)8 * K + (size_t)2 * B * K + (pieces ? (size_t)4 * pieces * B * K : 2u * B * K);
}

// NORM: x is not read but made -- add_norm's row (triton_math.cuh norm_row) from h and the
// delta before it, by every CTA into its own shared x rows (CTA 0 also stores h'), while the
// weights land.  Its inputs arrive by bulk copies on the x barrier: the norm weights before
// the PDL wait (weights), h and d1 after it (the kernels before made them) -- one L2 round
// trip, then three passes over shared memory.  The add_norm launch before the projection
// goes, and its reduction leaves the weight stream's path (the eighteenth session's Triton
// prologue had it in front: it lost).
template <int WARPS, int NT, bool PDL, int MODE, bool NORM>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_mma(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
             void* __restrict__ out, int B, int N, int K, int KS, NormArgs na) {
  constexpr int R = 8 * NT * WARPS;                 // output columns a CTA
  constexpr int HALVES = MODE == GLU ? 2 : 1;       // GLU: gate rows, then up rows
  constexpr int THREADS = 32 * WARPS;
  extern __shared__ __align__(128) unsigned char smem[];
  const int stride = 2 * KS + 16;                   // bytes a shared row
  const uint32_t bars = smem_u32(smem);             // CHUNKS + 1 mbarriers, 8 bytes each;
  float* scratch = reinterpret_cast<float*>(smem + 64);   // NORM's 9 floats at 64
  const uint32_t wsm = 128;                         // byte offsets: HALVES * R weight rows,
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
    mbar_expect(bars + 8 * CHUNKS, NORM ? norm_bytes(B, K, na.pieces) : B * klen * 2);
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
  // NORM's staging: [w_post | w_next | h | d1] after the x rows (16-byte aligned: K % 64 == 0)
  const uint32_t nsm = xsm + B * stride;
  const uint32_t hsm = nsm + 8 * K, dsm = hsm + 2 * B * K;
  if (NORM && tid == 0) {
    bulk_copy(bars + nsm, na.w_post, 4 * K, bars + 8 * CHUNKS);
    bulk_copy(bars + nsm + 4 * K, na.w_next, 4 * K, bars + 8 * CHUNKS);
  }
  if (PDL) {   // x is the kernel before's output: wait for it, then let the next one launch
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (NORM) {         // K == KS == the norm's width: the whole row
    if (tid == 0) bulk_copy(bars + hsm, na.h, 2 * B * K, bars + 8 * CHUNKS);
    if (tid == THREADS - 1)
      bulk_copy(bars + dsm, na.d1, norm_bytes(B, K, na.pieces) - 8 * K - 2 * B * K,
                bars + 8 * CHUNKS);
    NormArgs sa = na;                               // the same operands, from shared memory
    sa.w_post = reinterpret_cast<const float*>(smem + nsm);
    sa.w_next = reinterpret_cast<const float*>(smem + nsm + 4 * K);
    sa.h = reinterpret_cast<const __nv_bfloat16*>(smem + hsm);
    sa.d1 = smem + dsm;
    mbar_wait(bars + 8 * CHUNKS, 0);
    for (int b = 0; b < B; ++b)
      norm_row<THREADS>(sa, b, B, K, reinterpret_cast<__nv_bfloat16*>(smem + xsm + b * stride),
                        scratch, blockIdx.x == 0);
    __syncthreads();   // x rows made (norm_row's last pass is any thread's)
  } else if (tid < B) {
    bulk_copy(bars + xsm + tid * stride, x + (size_t)tid * K + k0, klen * 2, bars + 8 * CHUNKS);
  }

  float acc[HALVES][NT][4];
#pragma unroll
  for (int h = 0; h < HALVES; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
  const bool ra = g < B, rb = g + 8 < B;
  const uint32_t xa = xsm + g * stride + 4 * t, xb = xa + 8 * stride;
  const uint32_t wr = wsm + (warp * 8 * NT + g) * stride + 4 * t;
  if (!NORM) mbar_wait(bars + 8 * CHUNKS, 0);
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

template <int WARPS, int NT, bool PDL, int MODE, bool NORM>
int launch(const void* x, const void* w, void* y, int B, int N, int K, int KS,
           const NormArgs& na, cudaStream_t stream) {
  constexpr int R = 8 * NT * WARPS;
  constexpr int HALVES = MODE == GLU ? 2 : 1;
  const size_t smem = 128 + (size_t)(HALVES * R + B) * (2 * KS + 16) +
                      (NORM ? norm_bytes(B, K, na.pieces) : 0);
  if (smem > 227 * 1024) return -2;
  static size_t raised = 0;                         // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(gemv_mma<WARPS, NT, PDL, MODE, NORM>,
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
  return (int)cudaLaunchKernelEx(&cfg, gemv_mma<WARPS, NT, PDL, MODE, NORM>,
                                 (const __nv_bfloat16*)x, (const __nv_bfloat16*)w, y, B, N, K, KS,
                                 na);
}

template <int MODE, bool NORM>
int launch_shape(const void* x, const void* w, void* y, int B, int N, int K, int KS,
                 const NormArgs& na, int warps, int nt, int pdl, cudaStream_t s) {
#define MUSER_CASE(W, T)                                                              \
  case W * 10 + T:                                                                   \
    return pdl ? launch<W, T, true, MODE, NORM>(x, w, y, B, N, K, KS, na, s)          \
               : launch<W, T, false, MODE, NORM>(x, w, y, B, N, K, KS, na, s);
  switch (warps * 10 + nt) {
    MUSER_CASE(1, 1)
    MUSER_CASE(2, 1)
    MUSER_CASE(4, 1)
    MUSER_CASE(1, 2)
    MUSER_CASE(2, 2)
    default: return -1;
  }
#undef MUSER_CASE
}

// The shape rules both entry points share; 0 when the kernel takes it.
int refuse(int B, int N, int K, int ks, int mode) {
  if (ks <= 0 || ks > K || ks % 64 || (K % ks) % 64 || N % 8 || B < 1 || B > 16) return -1;
  if (mode != SPLIT && ks != K) return -1;   // pieces only as pieces: PLAIN / GLU end whole sums
  return 0;
}

}  // namespace

// mode 0 PLAIN (y bf16 [B, N]), 1 GLU (w [2N, K], y bf16 [B, N]), 2 SPLIT (y float32
// [pieces, B, N]); ks: keys a split-K piece (K: none).  0 on success; -1 a shape it does not
// take, -2 too much shared memory, else a cudaError_t.
extern "C" int gemv_mma_launch(const void* x, const void* w, void* y, int B, int N, int K,
                               int ks, int mode, int warps, int nt, int pdl, void* stream) {
  if (refuse(B, N, K, ks, mode)) return -1;
  cudaStream_t s = (cudaStream_t)stream;
  const NormArgs none = {};
  switch (mode) {
    case PLAIN: return launch_shape<PLAIN, false>(x, w, y, B, N, K, ks, none, warps, nt, pdl, s);
    case GLU: return launch_shape<GLU, false>(x, w, y, B, N, K, ks, none, warps, nt, pdl, s);
    case SPLIT: return launch_shape<SPLIT, false>(x, w, y, B, N, K, ks, none, warps, nt, pdl, s);
    default: return -1;
  }
}

// The same projection (PLAIN or GLU, whole K) of x = add_norm's row, made in the launch:
// h_out = h + norm(d1, w_post), x = norm(h_out, w_next) (NormArgs; RMS).  tw, block: add_norm's
// warps and BLOCK for N = K (its reduction tree).  Return codes as gemv_mma_launch's.
extern "C" int gemv_norm_launch(const void* h, const void* d1, int pieces, const void* w_post,
                                const void* w_next, void* h_out, float eps, int tw, int block,
                                const void* w, void* y, int B, int N, int K, int mode, int warps,
                                int nt, int pdl, void* stream) {
  if (refuse(B, N, K, K, mode) || mode == SPLIT || pieces < 0 || (tw != 4 && tw != 8) ||
      block < K || block & (block - 1) || block < 8 * 32 * tw || warps > tw ||
      ((uintptr_t)h | (uintptr_t)d1 | (uintptr_t)w_post | (uintptr_t)w_next) & 15)
    return -1;   // the bulk copies take 16-byte aligned sources
  const NormArgs na = {(const __nv_bfloat16*)h, d1, (const float*)w_post, (const float*)w_next,
                       (__nv_bfloat16*)h_out, eps, pieces, tw, block};
  cudaStream_t s = (cudaStream_t)stream;
  return mode == PLAIN
             ? launch_shape<PLAIN, true>(nullptr, w, y, B, N, K, K, na, warps, nt, pdl, s)
             : launch_shape<GLU, true>(nullptr, w, y, B, N, K, K, na, warps, nt, pdl, s);
}
