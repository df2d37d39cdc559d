"""The last persistent form not probed: a loader warp that streams every stage's weights through
a ring of shared-memory pages by bulk copies (the copy engine, completion on mbarriers) and never
waits for a dependency, while four consumer warps wait on the stage counter and compute -- the
shape of Hazy Research's megakernel (issue 17; benchmarks/NOTES.md, forty-fourth and forty-fifth
sessions).

Every persistent form probed so far lost to the PDL launches the step already makes
(sync_floor.py: weights asked for at a stage's start or a stage ahead in registers;
sync_pipe_probe.py: a cp.async ring in Gluon, two CTA barriers a tile).  What none had is a
loader that runs ahead by *pages*, across any number of stage boundaries, without a CTA barrier:
here warp 4's lane 0 walks all S x NP pages of its CTA's slabs (stage s's rows
[pid * R, pid * R + R) of an [N, N] bf16 matrix are R * N * 2 contiguous bytes: NP pages of 16
KB), waiting only for a free page; the consumers wait for the page (its mbarrier's phase) and,
at a stage's first page, for the counter (thread 0, ld.acquire.gpu, then a named barrier of the
128 consumer threads), then each warp takes whole rows of the page (a lane 16-byte chunks, x
held in registers), reduces with shuffles, stores y, frees the page (one arrive a warp).  After
its last page: a named barrier, thread 0 adds 1 to the counter (release).

    y = W_s @ x_s as float32 sums (four chains a lane, then the butterfly), S stages, G
    programs (all resident), us a stage = graph replay / S

Rows: sync_floor's "launches, PDL, weights early" (the step's form); this kernel with no loader
(NBUF 0: each warp loads its rows into registers before the counter wait -- sync_floor's
"barrier, weights early" in this kernel's arithmetic, so that loader rows minus this row is what
the pages buy, whatever the consumers' own chain costs); the loader with 2, 4, 8 or 12 pages in
the ring; and the loader's 12 pages with no counter wait at all (a race by construction -- its
vector is not checked).  The last vector of each row against the launches' (another summation
order: close, "RACE?" past 1e-3).  First run (forty-sixth session, H100, before the NBUF 0 row
and with a fence.sc.gpu before each release): the loader 3.3 / 6.0 us a stage at 2 / 8 MB
against the launches' 1.67 / 3.92, and 3.0 / 5.6 with no wait -- so (inferred, not measured) the
consumers' per-stage chain, not the pages, set the time; the NBUF 0 row separates the two.
Second run (forty-seventh session, H100, this build): launches 1.67 / 3.92, NBUF 0 2.56 / 5.00,
the loader 2.95-3.04 / 5.55-5.80 -- the pages lose to no loader, the counter to the launches:
no persistent form has a case on this GPU (benchmarks/NOTES.md, "Forty-seventh session").

    PYTHONPATH=benchmarks:. python3 benchmarks/loader_warp_probe.py [--n 1024 2048]  # sm_90 GPU
    PYTHONPATH=benchmarks:. python3 benchmarks/loader_warp_probe.py --build-only      # nvcc only
"""
import argparse
import ctypes

from nvcc_so import build_so

RINGS = (2, 4, 8, 12)                      # pages of 16 KB in the ring (12: 192 KB)
PROGRAMS = 128                             # the kernel's G: all resident on an H100 / H200
SRC = r"""
#include "sm90.cuh"
constexpr int PAGE = 16384, CW = 4, G = 128;  // bytes a page; consumer warps (warp CW loads);
                                              // programs (all resident: the counter's wait)

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}"
               ::"r"(bar) : "memory");
}

// NBUF 0's weights must be asked for before the counter wait, and ptxas sinks weak loads past
// an acquire (legal: an acquire orders what follows it, not what precedes it) -- __ldg or volatile
// asm alike, the PTX in order, the SASS not.  So the wait's target takes a word of every load,
// ANDed with a zero the compiler cannot see (a kernel argument): thread 0 polls only once its
// loads have landed -- max(loads, dependency), as asking early means -- and nothing moves.
__device__ __forceinline__ int after_loads(int target, uint32_t words, int zero) {
  return target + (int)(words & (uint32_t)zero);
}

__device__ __forceinline__ void spin_until(const int* p, int target) {
  int c = 0;
  for (uint32_t polls = 0;; ++polls) {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(c) : "l"(p) : "memory");
    if (c >= target) return;
    if (polls == (1u << 28)) __trap();    // a lost program: an error, not a hung GPU
  }
}

// The dot of one weight row with this lane's x: v[c] = the row's 16-byte chunk lane + 32c (keys
// (lane + 32c) * 8 ..), four float32 chains, then the butterfly: every lane holds the sum.
template <int CH>
__device__ __forceinline__ float row_dot(const uint4 (&v)[CH], const float (&xr)[CH * 8]) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int c = 0; c < CH; ++c) {
    const uint32_t u[4] = {v[c].x, v[c].y, v[c].z, v[c].w};
    for (int h = 0; h < 4; ++h) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u[h]));
      acc[h] = fmaf(f.y, xr[c * 8 + 2 * h + 1], fmaf(f.x, xr[c * 8 + 2 * h], acc[h]));
    }
  }
  float a = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (int o = 16; o; o /= 2) a += __shfl_xor_sync(0xffffffffu, a, o);
  return a;
}

// S stages, y_s = W_s @ x_s: x_s in X[s % 2], y_s to X[(s + 1) % 2]; this CTA's rows
// [pid * R, pid * R + R) of stage s are R * N * 2 contiguous bytes = NP pages of PR rows.
//   page j (over all stages) -> ring slot j % NBUF, phase (j / NBUF) & 1
// NBUF 0 is the same consumer without the loader: each warp loads its rows of the stage from
// global memory into registers before the counter wait (sync_floor's "weights early" in this
// kernel's arithmetic), so loader rows minus this row is what the pages buy.
template <int N, int NBUF>
__global__ void __launch_bounds__(32 * (CW + 1), 1)
loader(float* X, const __nv_bfloat16* W, int* ctr, int S, int wait, int zero) {
  constexpr int R = N / G, NP = R * N * 2 / PAGE, PR = PAGE / (2 * N), RW = PR / CW;
  constexpr int CH = N / 256, SLOTS = NBUF ? NBUF : 1;   // 16-byte chunks a lane a row
  static_assert(PR % CW == 0 && NP >= 1, "whole rows a warp, whole pages a slab");
  extern __shared__ __align__(128) unsigned char ring[];          // [NBUF][PAGE]
  __shared__ __align__(8) uint64_t full[SLOTS], empty[SLOTS];
  const int pid = blockIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int b = 0; b < NBUF; ++b) {
      mbar_init(smem_u32(&full[b]), 1);
      mbar_init(smem_u32(&empty[b]), CW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (warp == CW) {                       // the loader: never waits for a dependency
    if constexpr (NBUF > 0) if (lane == 0)
      for (int j = 0; j < S * NP; ++j) {
        const int b = j % SLOTS, s = j / NP, p = j % NP;
        if (j >= NBUF) mbar_wait(smem_u32(&empty[b]), ((j / SLOTS) - 1) & 1);
        mbar_expect(smem_u32(&full[b]), PAGE);
        bulk_copy(smem_u32(ring + b * PAGE),
                  W + (size_t)s * N * N + (size_t)pid * R * N + (size_t)p * (PAGE / 2), PAGE,
                  smem_u32(&full[b]));
      }
    return;
  }
  uint4 held[NP * RW][CH];                // NBUF 0: the stage's rows (else unused, eliminated)
  int j = 0;
  for (int s = 0; s < S; ++s) {
    if constexpr (NBUF == 0)              // asked for before the wait: no dependency
      for (int p = 0; p < NP; ++p)
        for (int rw = 0; rw < RW; ++rw)
          for (int c = 0; c < CH; ++c)
            held[p * RW + rw][c] = __ldg(reinterpret_cast<const uint4*>(
                W + (size_t)s * N * N + (size_t)(pid * R + p * PR + warp * RW + rw) * N) +
                lane + 32 * c);
    if (s > 0 && wait) {
      uint32_t words = 0;
      if constexpr (NBUF == 0)
        for (int r = 0; r < NP * RW; ++r)
          for (int c = 0; c < CH; ++c) words |= held[r][c].x;
      if (threadIdx.x == 0) spin_until(ctr, after_loads(s * G, words, zero));
      asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");
    }
    float xr[CH * 8];                     // this lane's keys: chunk c = 8 keys at (lane + 32c) * 8
    const float4* xs = reinterpret_cast<const float4*>(X + (s % 2) * N);
    for (int c = 0; c < CH; ++c) {
      const float4 a = __ldcg(xs + (lane + 32 * c) * 2), q = __ldcg(xs + (lane + 32 * c) * 2 + 1);
      xr[c * 8 + 0] = a.x; xr[c * 8 + 1] = a.y; xr[c * 8 + 2] = a.z; xr[c * 8 + 3] = a.w;
      xr[c * 8 + 4] = q.x; xr[c * 8 + 5] = q.y; xr[c * 8 + 6] = q.z; xr[c * 8 + 7] = q.w;
    }
    for (int p = 0; p < NP; ++p, ++j) {
      const int b = j % SLOTS;
      if constexpr (NBUF > 0) mbar_wait(smem_u32(&full[b]), (j / SLOTS) & 1);
      for (int rw = 0; rw < RW; ++rw) {
        const int row = warp * RW + rw;   // in the page
        float y;
        if constexpr (NBUF > 0) {
          const uint4* w = reinterpret_cast<const uint4*>(ring + b * PAGE + row * N * 2);
          uint4 v[CH];
          for (int c = 0; c < CH; ++c) v[c] = w[lane + 32 * c];
          y = row_dot<CH>(v, xr);
        } else {
          y = row_dot<CH>(held[p * RW + rw], xr);
        }
        if (lane == 0) X[((s + 1) % 2) * N + pid * R + p * PR + row] = y;
      }
      __syncwarp();
      if constexpr (NBUF > 0) if (lane == 0) mbar_arrive(smem_u32(&empty[b]));
    }
    // every consumer's stores before the one release (CUTLASS's grid barrier: a CTA barrier,
    // then thread 0's red.release.gpu -- no fence.sc, which the first build paid each stage)
    asm volatile("bar.sync 1, %0;" ::"n"(32 * CW) : "memory");
    if (threadIdx.x == 0)
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(ctr) : "memory");
  }
}

template <int N, int NBUF>
int go(float* X, const __nv_bfloat16* W, int* ctr, int S, int wait, cudaStream_t st) {
  const int bytes = NBUF * PAGE;
  cudaError_t e = cudaFuncSetAttribute(loader<N, NBUF>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return (int)e;
  loader<N, NBUF><<<G, 32 * (CW + 1), bytes, st>>>(X, W, ctr, S, wait, 0);
  return (int)cudaGetLastError();
}

#define RING(n) \
  if (nbuf == 0) return go<n, 0>(X, W, ctr, S, wait, st); \
  if (nbuf == 2) return go<n, 2>(X, W, ctr, S, wait, st); \
  if (nbuf == 4) return go<n, 4>(X, W, ctr, S, wait, st); \
  if (nbuf == 8) return go<n, 8>(X, W, ctr, S, wait, st); \
  if (nbuf == 12) return go<n, 12>(X, W, ctr, S, wait, st);

extern "C" int loader_launch(float* X, const __nv_bfloat16* W, int* ctr, int S, int wait, int n,
                             int nbuf, cudaStream_t st) {
  if (n == 1024) { RING(1024) }
  if (n == 2048) { RING(2048) }
  return -1;                              // a shape not instantiated
}
"""


def run(lib, n: int, stages: int, replays: int, g: int) -> list[tuple[str, float, str]]:
    import torch

    import sync_floor as sf
    dev = torch.device("cuda")
    ww = min(16, max(4, (n // g) * n // 4096))            # sync_floor's warps for its rows
    x0 = torch.randn(n, device=dev)
    wt = (torch.randn(stages, n, n, device=dev) / n ** 0.5).to(torch.bfloat16)
    ctr = torch.zeros(4, dtype=torch.int32, device=dev)
    x = torch.empty(2, n, device=dev)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr())                              # noqa: E731
    rows = [("launches, PDL, weights early (sync_floor)", -1, 1),
            ("counter, weights early into registers, no loader (this kernel, NBUF 0)", 0, 1)]
    rows += [(f"counter, loader warp, {b} pages of 16 KB", b, 1) for b in RINGS]
    rows += [(f"loader warp, {RINGS[-1]} pages, no counter wait (no dependency: a race)",
              RINGS[-1], 0)]
    out, ref = [], None
    for name, nbuf, wait in rows:
        def step():
            x[0].copy_(x0)
            if nbuf < 0:
                for s in range(stages):
                    sf._launch_kernel[(g,)](x, wt, s, N=n, R=n // g, WK=1, EARLY=True, PDL=True,
                                            num_warps=ww, launch_pdl=True)
                return
            ctr.zero_()
            rc = lib.loader_launch(ptr(x), ptr(wt), ptr(ctr), stages, wait, n, nbuf,
                                   ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
            if rc:
                raise SystemExit(f"loader_launch: CUDA error {rc}")
        us, last = sf.stage_row(step, x, stages, replays)
        ref = last if ref is None else ref
        out.append((name, us, sf.vector_check(last, ref) if wait else "not checked"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 2048], choices=[1024, 2048])
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--build-only", action="store_true", help="compile, then stop (no GPU)")
    a = ap.parse_args()
    so = build_so("loader_warp", SRC, ("sm90.cuh",))
    if a.build_only:
        print(f"built {so}")
        return
    import torch
    lib = ctypes.CDLL(str(so))
    lib.loader_launch.restype = ctypes.c_int
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()} ({sms} SMs); {a.stages} stages, {PROGRAMS} "
          f"programs")
    for n in a.n:
        print(f"\n## N = {n} ({n // PROGRAMS} rows a program; weights "
              f"{n * n * 2 / 2 ** 20:.1f} MB a stage)\n\n| how a stage waits | us a stage | "
              f"last vector |\n|---|---:|---|")
        for name, us, check in run(lib, n, a.stages, a.replays, PROGRAMS):
            print(f"| {name} | {us:.2f} | {check} |", flush=True)


if __name__ == "__main__":
    main()
