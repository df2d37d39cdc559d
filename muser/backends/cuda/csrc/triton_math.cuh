// Float arithmetic transcribed from the PTX Triton 3.6 emits for sm_90, instruction for
// instruction, so that a C++ kernel gives a Triton kernel's bits: dot_rows' gelu(gate) * up
// ending (`gelu_up`) and add_norm's row (`norm_row`: triton_pieces._norm_inputs +
// _add_norm_tail, RMS with a post-norm, as the sandwich layers of Gemma 3 call it).  Every
// multiply and add is an explicit .rn intrinsic (no contraction into FMAs the Triton code does
// not have), and every approximate instruction is Triton's own (ex2.approx, rsqrt.approx.ftz,
// div.full).  Owns no memory movement beyond the row it norms (sm90.cuh, gemv_mma.cu).
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

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

// The same _act_up compiled without FMA contraction -- dot_rows turns it off for int8 weights
// (the PTX of its int8-row gate|up decode tile): gf^3 as ((gf * c) * gf) * gf, 2t as t + t,
// -2t as 0 - 2t, 2s - 1 + 1 as adds.  g and u arrive with their rows' scales applied.
__device__ __forceinline__ __nv_bfloat16 gelu_up_unfused(float g, float u) {
  const float gf = bf16_round(g);
  const float p = __fmul_rn(__fmul_rn(__fmul_rn(gf, 0.044714998453855515f), gf), gf);
  const float t = __fmul_rn(__fadd_rn(p, gf), 0.79788458347320557f);
  const float h = __fmul_rn(gf, 0.5f);
  const float m = __fsub_rn(0.0f, __fadd_rn(t, t));
  const float e = ex2_approx(__fmul_rn(m, 1.4426950216293335f));
  const float sg = div_full(1.0f, __fadd_rn(e, 1.0f));
  const float a = __fmul_rn(h, __fadd_rn(__fadd_rn(__fadd_rn(sg, sg), -1.0f), 1.0f));
  return __hmul(__float2bfloat16_rn(a), __float2bfloat16_rn(u));
}

__device__ __forceinline__ float rsqrt_approx(float x) {
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// a + b rounded once to bf16: Triton's `(h.to(f32) + d1).to(bf16)` of two bf16 values, which
// LLVM narrows to add.bf16x2 (the same sum a lane; .rn here forbids any contraction).
__device__ __forceinline__ __nv_bfloat16 add_bf16(__nv_bfloat16 a, __nv_bfloat16 b) {
  unsigned short d;
  asm("add.rn.bf16 %0, %1, %2;"
      : "=h"(d)
      : "h"(__bfloat16_as_ushort(a)), "h"(__bfloat16_as_ushort(b)));
  return __ushort_as_bfloat16(d);
}

// add_norm's operands for one launch (triton_ops.add_norm with d1 and w_post, RMS, w_next).
struct NormArgs {
  const __nv_bfloat16* h;   // [B, N] the residual stream
  const void* d1;           // [B, N] bf16 (pieces 0), or [pieces, B, N] float32 split-K sums
  const float* w_post;      // [N] d1's post-norm, effective weight (float32, as the engine keeps)
  const float* w_next;      // [N] the next norm's: x's
  __nv_bfloat16* h_out;     // [B, N] h' = h + norm(d1) -- one CTA stores it (norm_row's writer)
  __nv_bfloat16* x_out;     // [B, N] x, stored by that CTA too, or null (tests and probes: a
                            // difference then says which norm parted from add_norm's)
  float eps;
  int pieces;               // 0: d1 is bf16
  int tw;                   // add_norm's warps (triton_ops._row_shape: 4; 8 from N = 2,048)
  int block;                // its BLOCK: the power of two >= N, at least 8 keys a thread
};

// rsqrt(eps + sum(f(k)^2) / n) in Triton's reduction tree for tl.sum over BLOCK = reps * 8T
// keys on T = 32 tw threads (read off add_norm's sm_90 PTX at N = 640, 1,152 and 2,560):
//
//   Triton thread v holds keys   r * 8T + 8v + e    (rep r, e = 0..7; keys past n are 0)
//   its sum, rep by rep:         s = e1*e1; s = fma(e0, e0, s); s = fma(ek, ek, s) for the
//                                rest (LLVM contracts s + ek*ek, and for the first pair makes
//                                e1*e1 the addend)
//   a warp:                      butterfly, s += shfl_xor(s, o) for o = 16, 8, 4, 2, 1
//   the warps:                   their sums through shared memory, the same butterfly over tw
//                                lanes (o = tw/2 .. 1); then rsqrt.approx.ftz(eps + div.full(s, n))
//
// Every lane of a butterfly ends with the same bits (a + b == b + a), so it is a halving tree:
// step o adds slot i + o into slot i.  This CTA has THREADS <= T threads: thread t plays
// Triton's threads t, t + THREADS, ... -- the same lane, a butterfly each.  f(k) is called
// once a key k < n, by one thread (it may park a value in shared memory for the next pass).
// scratch: 9 floats of shared memory; a __syncthreads before it returns.
template <int THREADS, class F>
__device__ float norm_scale(const NormArgs& a, int n, float* scratch, F f) {
  const int T = 32 * a.tw, reps = a.block / (8 * T), lane = threadIdx.x & 31;
  for (int v = threadIdx.x; v < T; v += THREADS) {   // T / THREADS rounds: whole warps each
    float s = 0.f, first = 0.f;
    for (int r = 0; r < reps; ++r)
      for (int e = 0; e < 8; ++e) {
        const int k = r * 8 * T + 8 * v + e;
        const float x = k < n ? f(k) : 0.f;
        if (r == 0 && e == 0)
          first = x;
        else if (r == 0 && e == 1)
          s = __fmaf_rn(first, first, __fmul_rn(x, x));
        else
          s = __fmaf_rn(x, x, s);
      }
    for (int o = 16; o; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    if (lane == 0) scratch[v >> 5] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int o = a.tw / 2; o; o >>= 1)
      for (int i = 0; i < o; ++i) scratch[i] = __fadd_rn(scratch[i], scratch[i + o]);
    scratch[8] = rsqrt_approx(__fadd_rn(a.eps, div_full(scratch[0], (float)n)));
  }
  __syncthreads();
  return scratch[8];   // rewritten only after the next call's first barrier: all have read it
}

// add_norm's row b, as triton_pieces._norm_inputs + _add_norm_tail compute it (RMS, POST,
// NEXT; the multiplies in their order: (r * d) * w):
//   d  = d1[b] -- or its pieces summed in order from zero (y = 0; y += p_i) and rounded:
//        split_sum's bits
//   h' = h[b] + bf16((r1 * d) * w_post)     (bf16 add)     -> h_out[b] when `writer`
//   x  = bf16((r2 * h') * w_next)                          -> xrow, the MMA's A rows
//                                                             (and x_out[b], when given)
// d, then h', wait in xrow between passes (each key rewritten by the thread that wrote it).
template <int THREADS>
__device__ void norm_row(const NormArgs& a, int b, int B, int n, __nv_bfloat16* xrow,
                         float* scratch, bool writer) {
  const size_t row = (size_t)b * n;
  const float r1 = norm_scale<THREADS>(a, n, scratch, [&](int k) {
    __nv_bfloat16 d;
    if (a.pieces) {
      const float* p = static_cast<const float*>(a.d1) + row + k;
      float y = 0.f;
      for (int i = 0; i < a.pieces; ++i) y = __fadd_rn(y, p[(size_t)i * B * n]);
      d = __float2bfloat16_rn(y);
    } else {
      d = static_cast<const __nv_bfloat16*>(a.d1)[row + k];
    }
    xrow[k] = d;
    return __bfloat162float(d);
  });
  const float r2 = norm_scale<THREADS>(a, n, scratch, [&](int k) {
    const float y = __fmul_rn(__fmul_rn(r1, __bfloat162float(xrow[k])), a.w_post[k]);
    const __nv_bfloat16 hp = add_bf16(a.h[row + k], __float2bfloat16_rn(y));
    xrow[k] = hp;
    if (writer) a.h_out[row + k] = hp;
    return __bfloat162float(hp);
  });
  for (int k = threadIdx.x; k < n; k += THREADS) {  // after norm_scale's barrier: any thread
    xrow[k] = __float2bfloat16_rn(__fmul_rn(__fmul_rn(r2, __bfloat162float(xrow[k])),
                                            a.w_next[k]));
    if (writer && a.x_out) a.x_out[row + k] = xrow[k];
  }
}
}  // namespace
