// The kernel of gemv_mma.cu (whose header says what it computes and why): one CTA, R = 8 * NT
// * WARPS output columns over one split-K piece.  Owns the shared-memory layout and the order
// things are asked for; the arithmetic it must share with Triton is triton_math.cuh's, the
// instructions sm90.cuh's.
//
//   smem: [0, 64) mbarriers (CHUNKS weight quarters + x) | [64, 100) NORM's scratch |
//         [128, ...) HALVES * R weight rows, wstride bytes apart | B x rows, xstride apart |
//         NORM's staged inputs (norm_bytes)
//
// Q8: int8 weight rows (quant="int8": RowInt8, float32 scales [N], GLU [2N]) -- half the bytes
// copied; each k pair of the B fragment converted to bf16 (exact for |q| <= 127) in the
// fragment layout the bf16 rows have (triton_dot_loads' fence keeps Triton's int8 tile in
// it too), the scale applied to the finished sum as triton_dot_epilogue._finish does.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "slab.cuh"

namespace {

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
template <int WARPS, int NT, bool PDL, int MODE, bool NORM, bool Q8>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_mma(const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
             const float* __restrict__ scale, void* __restrict__ out, int B, int N, int K, int KS,
             NormArgs na) {
  constexpr int R = 8 * NT * WARPS;                 // output columns a CTA
  constexpr int HALVES = MODE == GLU ? 2 : 1;       // GLU: gate rows, then up rows
  constexpr int THREADS = 32 * WARPS;
  constexpr int WB = Q8 ? 1 : 2;                    // bytes a weight
  extern __shared__ __align__(128) unsigned char smem[];
  const int wstride = WB * KS + 16, xstride = 2 * KS + 16;   // bytes a shared row: the 16-byte
  const uint32_t bars = smem_u32(smem);             // skew spreads a fragment read over banks
  float* scratch = reinterpret_cast<float*>(smem + 64);
  const uint32_t wsm = 128;                         // byte offsets: HALVES * R weight rows,
  const uint32_t xsm = wsm + HALVES * R * wstride;  // then B rows of x
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * R, piece = blockIdx.y;
  const int k0 = piece * KS, klen = min(KS, K - k0);
  const int rows = min(R, N - n0);
  const int kc = klen / CHUNKS;                     // keys a quarter (a multiple of 16)

  if (tid == 0) {
    for (int c = 0; c <= CHUNKS; ++c) mbar_init(bars + 8 * c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < CHUNKS; ++c) mbar_expect(bars + 8 * c, HALVES * rows * kc * WB);
    mbar_expect(bars + 8 * CHUNKS, NORM ? norm_bytes(B, K, na.pieces) : B * klen * 2);
  }
  __syncthreads();
  copy_slab<HALVES, R, WB, THREADS>(bars + wsm, bars, wstride, w, N, K, n0, rows, k0, kc);
  // NORM's staging: [w_post | w_next | h | d1] after the x rows (16-byte aligned: K % 64 == 0)
  const uint32_t nsm = xsm + B * xstride;
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
      norm_row<THREADS>(sa, b, B, K, reinterpret_cast<__nv_bfloat16*>(smem + xsm + b * xstride),
                        scratch, blockIdx.x == 0);
    __syncthreads();   // x rows made (norm_row's last pass is any thread's)
  } else if (tid < B) {
    bulk_copy(bars + xsm + tid * xstride, x + (size_t)tid * K + k0, klen * 2, bars + 8 * CHUNKS);
  }

  if (!NORM) mbar_wait(bars + 8 * CHUNKS, 0);
  float acc[HALVES][NT][4];
  slab_sums<HALVES, NT, Q8, R>(acc, smem, bars, xsm, xstride, wsm, wstride, B, kc);
  store_tile<HALVES, NT, MODE, Q8>(acc, out, scale, B, N, n0 + warp * 8 * NT, piece, g, t);
}

}  // namespace
