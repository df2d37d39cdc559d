// A CTA's weight slab and its sums, the pieces every projection kernel here shares
// (gemv_kernel.cuh: one projection a launch; mlp_chain.cuh: gate|up then down in one launch):
// the slab's bulk copies (`copy_slab`), the k16 MMA steps over it (`mma_steps`, `slab_sums`)
// and dot_rows' three endings (`store_tile`).  The arithmetic here is dot_rows' decode tile's
// (gemv_mma.cu's header says why it is); the order things are asked for is the kernels'.
//
//   a slab: HALVES * R weight rows (GLU: gate's R, then up's R), wstride = WB * KS + 16 bytes
//   apart in shared memory (the 16-byte skew spreads a fragment read over the 32 banks),
//   landing in CHUNKS quarters of the piece's keys, an mbarrier each.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "sm90.cuh"
#include "triton_math.cuh"

namespace {


constexpr int CHUNKS = 4;
enum Mode { PLAIN = 0, GLU = 1, SPLIT = 2 };

// Two int8 weights (the low byte the lower k) as the bf16 pair a B-fragment register holds.
__device__ __forceinline__ uint32_t i8x2_bf16x2(uint32_t v) {
  const __nv_bfloat162 r = __floats2bfloat162_rn((float)(int8_t)(v & 0xff),
                                                 (float)(int8_t)((v >> 8) & 0xff));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The k16 MMA steps s0 .. s1 - 1 of a warp's NT n8 tiles (HALVES: gate's, then up's R rows
// further on), in order: the arithmetic every kernel here shares with dot_rows' decode tile.
// xa / xb: lane (g, t)'s x rows g and g + 8 (their bytes 4t..), wr: its weight row g (k pair
// 2t); ra / rb: whether those x rows exist (the MMA's rows past B are zeros).
template <int HALVES, int NT, bool Q8, int R>
__device__ __forceinline__ void mma_steps(float (&acc)[HALVES][NT][4], const unsigned char* smem,
                                          uint32_t xa, uint32_t xb, uint32_t wr, int wstride,
                                          int s0, int s1, bool ra, bool rb) {
  constexpr int WB = Q8 ? 1 : 2;
#pragma unroll 4
  for (int s = s0; s < s1; ++s) {
    const uint32_t o = 32 * s;                      // x bytes: 16 keys a step
    const uint32_t a0 = ra ? lds32(smem, xa + o) : 0u, a1 = rb ? lds32(smem, xb + o) : 0u;
    const uint32_t a2 = ra ? lds32(smem, xa + o + 16) : 0u;
    const uint32_t a3 = rb ? lds32(smem, xb + o + 16) : 0u;
#pragma unroll
    for (int h = 0; h < HALVES; ++h)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t p = wr + (h * R + j * 8) * wstride + 16 * WB * s;
        const uint32_t b0 = Q8 ? i8x2_bf16x2(lds16(smem, p)) : lds32(smem, p);
        const uint32_t b1 = Q8 ? i8x2_bf16x2(lds16(smem, p + 8)) : lds32(smem, p + 16);
        mma16816(acc[h][j], a0, a1, a2, a3, b0, b1);
      }
  }
}

// A warp's finished sums out, dot_rows' endings: its NT n8 tiles from output column c0 (the
// D fragment: d0, d1 row g, columns 2t, 2t + 1 of an n8 tile; d2, d3 row g + 8).
template <int HALVES, int NT, int MODE, bool Q8>
__device__ __forceinline__ void store_tile(const float (&acc)[HALVES][NT][4], void* out,
                                           const float* scale, int B, int N, int c0, int piece,
                                           int g, int t) {
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = c0 + j * 8 + 2 * t;
    if (col >= N) continue;
    // Q8: the rows' scales (gate's, then up's for GLU); SPLIT leaves them to the add+norm
    const bool scaled = Q8 && MODE != SPLIT;
    const float sg0 = scaled ? scale[col] : 1.f, sg1 = scaled ? scale[col + 1] : 1.f;
    const float su0 = scaled && MODE == GLU ? scale[N + col] : 1.f;
    const float su1 = scaled && MODE == GLU ? scale[N + col + 1] : 1.f;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = g + 8 * half;
      if (row >= B) continue;
      float v0 = acc[0][j][2 * half], v1 = acc[0][j][2 * half + 1];
      if (MODE == SPLIT) {
        float2* p = reinterpret_cast<float2*>(
            static_cast<float*>(out) + ((size_t)piece * B + row) * N + col);
        *p = make_float2(v0, v1);
        continue;
      }
      if (scaled) {
        v0 = __fmul_rn(v0, sg0);
        v1 = __fmul_rn(v1, sg1);
      }
      __nv_bfloat162 r;
      if (MODE == GLU) {
        const float u0 = acc[HALVES - 1][j][2 * half], u1 = acc[HALVES - 1][j][2 * half + 1];
        r.x = Q8 ? gelu_up_unfused(v0, __fmul_rn(u0, su0)) : gelu_up(v0, u0);
        r.y = Q8 ? gelu_up_unfused(v1, __fmul_rn(u1, su1)) : gelu_up(v1, u1);
      } else {
        r = __floats2bfloat162_rn(v0, v1);
      }
      *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + (size_t)row * N +
                                         col) = r;
    }
  }
}

// NORM: x is not read but made -- add_norm's row (triton_math.cuh norm_row) from h and the
// delta before it, by every CTA into its own shared x rows (CTA 0 also stores h'), while the
// weights land.  Its inputs arrive by bulk copies on the x barrier: the norm weights before
// the PDL wait (weights), h and d1 after it (the kernels before made them) -- one L2 round

// The bulk copies of a slab: HALVES * R rows (rows of each half real, the rest not asked for)
// x CHUNKS quarters of kc keys from key k0, quarter-major (quarter 0 of every row first, so the
// MMAs of quarter 0 start soonest); quarter c completes on mbarrier bar0 + 8 c.  dst: the
// slab's shared address; w: [HALVES * N, K] rows of WB bytes a weight.
template <int HALVES, int R, int WB, int THREADS>
__device__ __forceinline__ void copy_slab(uint32_t dst, uint32_t bar0, int wstride,
                                          const void* w, int N, int K, int n0, int rows, int k0,
                                          int kc) {
  const unsigned char* wb = static_cast<const unsigned char*>(w);
  for (int i = threadIdx.x; i < HALVES * R * CHUNKS; i += THREADS) {
    const int r = i % (HALVES * R), c = i / (HALVES * R);
    const int half = r / R, rr = r % R;
    if (rr < rows)
      bulk_copy(dst + r * wstride + c * kc * WB,
                wb + ((size_t)(half * N + n0 + rr) * K + k0 + c * kc) * WB, kc * WB,
                bar0 + 8 * c);
  }
}

// A warp's sums over a slab whose x rows sit xstride apart at byte offset xsm and whose
// weights sit at wsm: each quarter's MMA steps once its barrier (bar0 + 8 c, phase 0) says it
// landed.  Lane (g, t): x rows g and g + 8 (bytes 4t..), weight row warp * 8 NT + g (k pair
// 2t; WB bytes a weight).
template <int HALVES, int NT, bool Q8, int R>
__device__ __forceinline__ void slab_sums(float (&acc)[HALVES][NT][4], const unsigned char* smem,
                                          uint32_t bar0, uint32_t xsm, int xstride, uint32_t wsm,
                                          int wstride, int B, int kc) {
  constexpr int WB = Q8 ? 1 : 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int h = 0; h < HALVES; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
  const bool ra = g < B, rb = g + 8 < B;
  const uint32_t xa = xsm + g * xstride + 4 * t, xb = xa + 8 * xstride;
  const uint32_t wr = wsm + (warp * 8 * NT + g) * wstride + 2 * WB * t;
  for (int c = 0; c < CHUNKS; ++c) {
    mbar_wait(bar0 + 8 * c, 0);
    mma_steps<HALVES, NT, Q8, R>(acc, smem, xa, xb, wr, wstride, c * kc / 16, (c + 1) * kc / 16,
                                 ra, rb);
  }
}

}  // namespace
