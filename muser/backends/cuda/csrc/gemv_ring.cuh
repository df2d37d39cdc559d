// The ring kernel of gemv_mma.cu (MUSER_DOT_CPP=ring): the same projection and the same
// arithmetic as gemv_kernel.cuh's slab kernel (mma_steps, store_tile), with the bytes streamed
// instead of held.  The slab kernel asks for a CTA's whole weight slab at once: a 1B gate|up
// CTA holds 74 KB, a 4B down CTA 164 KB, so one to three CTAs an SM, and a CTA's copies cannot
// start before one leaves (measured: the big projections 15-170% slower than Triton's tile).
// Here a CTA's shared memory is a ring of S slots of KC keys:
//
//   slot s: [HALVES * R weight rows x KC keys, wstride apart | B x rows x KC keys, xstride]
//
//   stream j = 0, 1, ...: (item, chunk) pairs, item = blockIdx.x + m * gridDim.x (m = 0, 1, ..)
//   an item: R output columns (GLU: and their up rows) over one split-K piece; its chunks the
//   piece's keys KC at a time (the last one shorter).  Position j lives in slot j % S; its
//   mbarrier's phase (j / S) & 1 completes when its weight and x bytes have landed.
//
//   j:      0    1    2    3    4    5 ...          S = 4
//   copy:   [pre-wait: w of 0..3] [x of 0..3]  w+x of 4 after 0 is read, of 5 after 1, ...
//   MMA:                                   0    1    2    3    4 ...
//
// so a CTA needs S * (HALVES * R * (WB KC + 16) + B (2 KC + 16)) bytes (a 1B gate|up CTA at
// R = 8, KC = 256, S = 4: 35 KB -- six or more CTAs an SM), and the grid is at most what is
// resident at once (the host asks the occupancy): CTAs walk items until none are left, each
// keeping S chunks in flight across item boundaries.  The weights of the first S positions are
// asked for before the PDL wait (they do not depend on the launch before), x's after it.
//
// Warp 0 issues the copies (its lanes a row each); every warp reads a slot, then the CTA syncs
// and warp 0 refills it with position j + S.  Sums and endings: an output's k16 steps in order
// from zero over its piece (chunks only split where the steps pause), ended as dot_rows ends it.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

#include "gemv_kernel.cuh"

namespace {

constexpr int RING_SLOTS = 16;                      // S at most: 16 mbarriers in 128 bytes

// One position of a CTA's stream: an item (R columns x one piece) and a chunk of its keys.
struct RingPos {
  int item, chunk;
};

template <int R, int HALVES, bool Q8>
struct Ring {
  static constexpr int WB = Q8 ? 1 : 2;
  int B, N, K, KS, KC, S, tiles, items;
  __device__ int klen(int item) const { return min(KS, K - (item / tiles) * KS); }
  __device__ int clen(RingPos p) const { return min(KC, klen(p.item) - p.chunk * KC); }
  __device__ RingPos next(RingPos p) const {  // the CTA's next position (items gridDim apart)
    return (p.chunk + 1) * KC < klen(p.item) ? RingPos{p.item, p.chunk + 1}
                                             : RingPos{p.item + (int)gridDim.x, 0};
  }
  __device__ uint32_t wstride() const { return WB * KC + 16; }
  __device__ uint32_t slot(int j) const {    // byte offset of position j's slot
    return 128 + (uint32_t)(j % S) * (HALVES * R * wstride() + B * (2 * KC + 16));
  }
  // Warp 0's lanes: the weight rows of position j (with the slot's expected bytes, w and x)
  // or its x rows.  Rows past N are not copied (their columns are never stored).
  __device__ void copy(const unsigned char* smem, const void* w, const __nv_bfloat16* x, int j,
                       RingPos p, bool weights, bool xs) const {
    const uint32_t base = smem_u32(smem), bar = base + 8 * (j % S), dst = base + slot(j);
    const int lane = threadIdx.x & 31, n0 = (p.item % tiles) * R, rows = min(R, N - n0);
    const int k0 = (p.item / tiles) * KS + p.chunk * KC, len = clen(p);
    if (weights) {
      if (lane == 0) mbar_expect(bar, HALVES * rows * len * WB + B * len * 2);
      const unsigned char* wb = static_cast<const unsigned char*>(w);
      for (int r = lane; r < HALVES * R; r += 32)
        if (r % R < rows)
          bulk_copy(dst + r * wstride(), wb + ((size_t)((r / R) * N + n0 + r % R) * K + k0) * WB,
                    len * WB, bar);
    }
    if (xs && lane < B)
      bulk_copy(dst + HALVES * R * wstride() + lane * (2 * KC + 16), x + (size_t)lane * K + k0,
                len * 2, bar);
  }
};

template <int WARPS, int NT, bool PDL, int MODE, bool Q8>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_ring(const __nv_bfloat16* __restrict__ x, const void* __restrict__ w,
              const float* __restrict__ scale, void* __restrict__ out, int B, int N, int K, int KS,
              int KC, int S) {
  constexpr int R = 8 * NT * WARPS, HALVES = MODE == GLU ? 2 : 1;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tiles = (N + R - 1) / R;
  const Ring<R, HALVES, Q8> ring{B, N, K, KS, KC, S, tiles, tiles * ((K + KS - 1) / KS)};
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t bars = smem_u32(smem);
  if (tid == 0) {
    for (int s = 0; s < S; ++s) mbar_init(bars + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  RingPos p = {(int)blockIdx.x, 0};                 // warp 0's: the next position to copy
  int ahead = 0;
  if (warp == 0)                                    // weights first: they need no wait
    for (; ahead < S && p.item < ring.items; ++ahead, p = ring.next(p))
      ring.copy(smem, w, x, ahead, p, true, false);
  if (PDL) {   // x is the kernel before's output: wait for it, then let the next one launch
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
  if (warp == 0) {
    RingPos q = {(int)blockIdx.x, 0};
    for (int j = 0; j < ahead; ++j, q = ring.next(q)) ring.copy(smem, w, x, j, q, false, true);
  }

  float acc[HALVES][NT][4] = {};
  const bool ra = g < B, rb = g + 8 < B;
  // lane (g, t): x rows g, g + 8 and weight row g of its warp's tiles, as in the slab kernel
  const uint32_t xrow = HALVES * R * ring.wstride() + g * (2 * KC + 16) + 4 * t;
  const uint32_t wrow = (warp * 8 * NT + g) * ring.wstride() + 2 * Ring<R, HALVES, Q8>::WB * t;
  int j = 0;
  for (RingPos c = {(int)blockIdx.x, 0}; c.item < ring.items; c = ring.next(c), ++j) {
    const uint32_t at = ring.slot(j);
    mbar_wait(bars + 8 * (j % S), (j / S) & 1);
    mma_steps<HALVES, NT, Q8, R>(acc, smem, at + xrow, at + xrow + 8 * (2 * KC + 16), at + wrow,
                                 ring.wstride(), 0, ring.clen(c) / 16, ra, rb);
    if ((c.chunk + 1) * KC >= ring.klen(c.item)) {  // the item's last chunk: end its sums
      store_tile<HALVES, NT, MODE, Q8>(acc, out, scale, B, N,
                                       (c.item % tiles) * R + warp * 8 * NT, c.item / tiles, g, t);
#pragma unroll
      for (int h = 0; h < HALVES; ++h)
#pragma unroll
        for (int n = 0; n < NT; ++n) acc[h][n][0] = acc[h][n][1] = acc[h][n][2] = acc[h][n][3] = 0.f;
    }
    __syncthreads();                                // every warp has read slot j % S
    if (warp == 0 && p.item < ring.items) {
      ring.copy(smem, w, x, j + S, p, true, true);
      p = ring.next(p);
    }
  }
}

}  // namespace
