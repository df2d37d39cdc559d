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

// Two int8 weights (the low byte the lower k) as the bf16 pair a B-fragment register holds.
__device__ __forceinline__ uint32_t i8x2_bf16x2(uint32_t v) {
  const __nv_bfloat162 r = __floats2bfloat162_rn((float)(int8_t)(v & 0xff),
                                                 (float)(int8_t)((v >> 8) & 0xff));
  return *reinterpret_cast<const uint32_t*>(&r);
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
  // HALVES * R rows x CHUNKS quarters, quarter-major: quarter 0 of every row first
  const unsigned char* wb = static_cast<const unsigned char*>(w);
  for (int i = tid; i < HALVES * R * CHUNKS; i += THREADS) {
    const int r = i % (HALVES * R), c = i / (HALVES * R);
    const int half = r / R, rr = r % R;
    if (rr < rows)
      bulk_copy(bars + wsm + r * wstride + c * kc * WB,
                wb + ((size_t)(half * N + n0 + rr) * K + k0 + c * kc) * WB, kc * WB,
                bars + 8 * c);
  }
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

  float acc[HALVES][NT][4];
#pragma unroll
  for (int h = 0; h < HALVES; ++h)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[h][j][0] = acc[h][j][1] = acc[h][j][2] = acc[h][j][3] = 0.f;
  const bool ra = g < B, rb = g + 8 < B;
  const uint32_t xa = xsm + g * xstride + 4 * t, xb = xa + 8 * xstride;
  // lane (g, t)'s k pairs 2t, 2t + 1 and 2t + 8, 2t + 9 of weight row g: 2 bytes a weight,
  // a 32-bit word each (bf16), or 1 byte, a 16-bit half-word each (int8)
  const uint32_t wr = wsm + (warp * 8 * NT + g) * wstride + 2 * WB * t;
  if (!NORM) mbar_wait(bars + 8 * CHUNKS, 0);
  for (int c = 0; c < CHUNKS; ++c) {
    mbar_wait(bars + 8 * c, 0);
    const int s1 = (c + 1) * kc / 16;
#pragma unroll 4
    for (int s = c * kc / 16; s < s1; ++s) {
      const uint32_t o = 32 * s;                    // x bytes: 16 keys a step
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
  // D fragment: d0, d1 row g, columns 2t, 2t + 1 of the n8 tile; d2, d3 row g + 8
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int col = n0 + warp * 8 * NT + j * 8 + 2 * t;
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

}  // namespace
