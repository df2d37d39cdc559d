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
//          transcribed in triton_math.cuh: .rn multiplies and adds, ex2.approx, div.full);
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
// Also: int8 rows (quant="int8", gemv_kernel.cuh's Q8), and x made in the launch from the
// add+norm before it (NORM, gemv_norm_launch).  This file: the launches and their C entry
// points; the kernel: gemv_kernel.cuh.  Not product code: no bias, no widened or picking head.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "gemv_kernel.cuh"

namespace {

// The operands a launch passes on, whichever kernel it picks.
struct Operands {
  const void* x;        // bf16 [B, K] (NORM: none -- made in the launch)
  const void* w;        // bf16 or int8 [N (GLU 2N), K]
  const float* scale;   // int8: float32 [N (GLU 2N)]; bf16: none
  void* y;
  int B, N, K, KS;
  NormArgs na;
};

template <int WARPS, int NT, bool PDL, int MODE, bool NORM, bool Q8>
int launch(const Operands& o, cudaStream_t stream) {
  constexpr int R = 8 * NT * WARPS;
  constexpr int HALVES = MODE == GLU ? 2 : 1;
  const size_t smem = 128 + (size_t)HALVES * R * ((Q8 ? 1 : 2) * o.KS + 16) +
                      (size_t)o.B * (2 * o.KS + 16) +
                      (NORM ? norm_bytes(o.B, o.K, o.na.pieces) : 0);
  if (smem > 227 * 1024) return -2;
  auto* kern = gemv_mma<WARPS, NT, PDL, MODE, NORM, Q8>;
  static size_t raised = 0;                         // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    raised = smem;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((o.N + R - 1) / R, (o.K + o.KS - 1) / o.KS);
  cfg.blockDim = dim3(32 * WARPS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, kern, (const __nv_bfloat16*)o.x, o.w, o.scale, o.y, o.B,
                                 o.N, o.K, o.KS, o.na);
}

template <int MODE, bool NORM>
int launch_shape(const Operands& o, int warps, int nt, int pdl, cudaStream_t s) {
  const bool q8 = o.scale != nullptr;
#define MUSER_CASE(W, T)                                                                   \
  case W * 10 + T:                                                                        \
    return pdl ? (q8 ? launch<W, T, true, MODE, NORM, true>(o, s)                          \
                     : launch<W, T, true, MODE, NORM, false>(o, s))                        \
               : (q8 ? launch<W, T, false, MODE, NORM, true>(o, s)                         \
                     : launch<W, T, false, MODE, NORM, false>(o, s));
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
// [pieces, B, N]); ks: keys a split-K piece (K: none); scale: int8 weights' row scales (float32
// [N], GLU [2N]; SPLIT's pieces stay unscaled), or null for bf16 weights.  0 on success; -1 a
// shape it does not take, -2 too much shared memory, else a cudaError_t.
extern "C" int gemv_mma_launch(const void* x, const void* w, const void* scale, void* y, int B,
                               int N, int K, int ks, int mode, int warps, int nt, int pdl,
                               void* stream) {
  if (refuse(B, N, K, ks, mode)) return -1;
  cudaStream_t s = (cudaStream_t)stream;
  const Operands o = {x, w, (const float*)scale, y, B, N, K, ks, NormArgs{}};
  switch (mode) {
    case PLAIN: return launch_shape<PLAIN, false>(o, warps, nt, pdl, s);
    case GLU: return launch_shape<GLU, false>(o, warps, nt, pdl, s);
    case SPLIT: return launch_shape<SPLIT, false>(o, warps, nt, pdl, s);
    default: return -1;
  }
}

// The same projection (PLAIN or GLU, whole K) of x = add_norm's row, made in the launch:
// h_out = h + norm(d1, w_post), x = norm(h_out, w_next) (NormArgs; RMS; x also into x_out
// unless null).  tw, block: add_norm's warps and BLOCK for N = K (its reduction tree).  Return
// codes as gemv_mma_launch's.
extern "C" int gemv_norm_launch(const void* h, const void* d1, int pieces, const void* w_post,
                                const void* w_next, void* h_out, void* x_out, float eps, int tw,
                                int block,
                                const void* w, const void* scale, void* y, int B, int N, int K,
                                int mode, int warps, int nt, int pdl, void* stream) {
  if (refuse(B, N, K, K, mode) || mode == SPLIT || pieces < 0 || (tw != 4 && tw != 8) ||
      block < K || block & (block - 1) || block < 8 * 32 * tw || warps > tw ||
      ((uintptr_t)h | (uintptr_t)d1 | (uintptr_t)w_post | (uintptr_t)w_next) & 15)
    return -1;   // the bulk copies take 16-byte aligned sources
  const NormArgs na = {(const __nv_bfloat16*)h, d1, (const float*)w_post, (const float*)w_next,
                       (__nv_bfloat16*)h_out, (__nv_bfloat16*)x_out, eps, pieces, tw, block};
  const Operands o = {nullptr, w, (const float*)scale, y, B, N, K, K, na};
  cudaStream_t s = (cudaStream_t)stream;
  return mode == PLAIN ? launch_shape<PLAIN, true>(o, warps, nt, pdl, s)
                       : launch_shape<GLU, true>(o, warps, nt, pdl, s);
}
