// A decode step's MLP -- gate|up with gelu(gate) * up, then down -- as ONE persistent launch
// (MUSER_DOT_CPP=mlp), and with the attention's o projection and the add+norm between them in
// front (MUSER_DOT_CPP=omlp: four launches a layer become one), for one question: do weights
// that are already in shared memory when a stage's input arrives beat launch boundaries?  (The
// fourteenth session's Triton MLP half waited on a counter *and then* streamed its weights: it
// lost.)
//
//   CTA c (grid G = the most items of any stage, all resident at once -- the host checks):
//
//     copy_slab(o item c) copy_slab(gate|up item c) copy_slab(down item c)   (before the PDL
//     [O] norm weights                                                       wait: no input)
//     griddepcontrol.wait
//     [O] attention rows ──► sums ──► o[:, cR..) ──► arrive 1
//     [O] wait 1 ──► h, o rows ──► add_norm's row (CTA 0 stores h') ─┐
//         x rows ◄───────────────────────────────────────────────────┘  (or x from global)
//     x ──► sums ──► act[:, cR..) ──► arrive 2 ──► launch_dependents
//     wait 2 ──► act rows ──► sums ──► y
//
// Each stage is gemv_mma.cu's slab kernel for that projection (slab.cuh: the same copies, MMA
// steps and endings) and the norm is its norm-in row (triton_math.cuh norm_row, add_norm's
// tree), so o, h', act and y are dot_rows' and add_norm's bits.  Whole-K projections only
// (no split-K pieces), bf16 weights.
//
// The grid barriers: a counter each in global memory (S: 1, or 2 with O), and an exit counter:
// a barrier is passed when its counter reaches G; the last CTA to leave sets all of them back
// to 0 (every other CTA has passed every wait by then), so a launch finds them at 0 whatever G
// the launch before had (launches on one stream never overlap past their arrivals: the next
// one waits in griddepcontrol.wait for the launches before it).  One counter a barrier: a CTA
// with no item before barrier 2 reaches it while others are still on their way to barrier 1.
// (A counter only ever added to, waited on at the next multiple of G, hung once launches of
// two CTA sizes shared it -- the forty-first session's first GPU run.)
// launch_dependents only after a CTA's last arrival: when the next kernel starts, every CTA of
// this one has been resident, so none can be kept off an SM by a kernel that spins waiting
// for this one (no deadlock).  Writes are published cooperative-groups style (__syncthreads,
// __threadfence, atomicAdd; the reader: spin, __threadfence, __syncthreads) and read back past
// the L1 (ld.global.cg).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "slab.cuh"

namespace {

struct Chain {
  const __nv_bfloat16* x;     // [B, KO] the attention's rows (O), else [B, H] gate|up's x
  const __nv_bfloat16* wo;    // [H, KO] (O)
  __nv_bfloat16* o;           // [B, H] o's output (O), a scratch the launch fills
  NormArgs na;                // (O) h, w_post, w_next, h_out, eps, tw, block; d1 = o
  const __nv_bfloat16* wgu;   // [2I, H] gate rows, then up rows
  const __nv_bfloat16* wd;    // [H, I]
  __nv_bfloat16* act;         // [B, I] gate|up's output, a scratch the launch fills
  __nv_bfloat16* y;           // [B, H]
  unsigned long long* counter;   // [S + 1]: the barriers', then the exit count
  int B, KO, H, I;
};

// shared memory: [0, 128) mbarriers | gate|up slab (2R rows of 2H + 16 bytes) | down slab (R
// rows of 2I + 16) | x rows (B of 2H + 16) | act rows (B of 2I + 16) | O: o slab (R rows of
// 2KO + 16) | attention rows (B of 2KO + 16) | w_post, w_next (float32 [H]) | h, o (bf16 [B, H])
__host__ __device__ inline size_t chain_smem(int R, int B, int KO, int H, int I, bool O) {
  const size_t mlp = 128 + (size_t)(2 * R + B) * (2 * H + 16) + (size_t)(R + B) * (2 * I + 16);
  return O ? mlp + (size_t)(R + B) * (2 * KO + 16) + 8 * H + 4 * (size_t)B * H : mlp;
}

// Arrive at a barrier: this CTA's stores done and published, then one more on its counter.
__device__ __forceinline__ void arrive(unsigned long long* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1ull);
  }
}

// Wait until every CTA of the grid has arrived at the barrier `counter` counts.
__device__ __forceinline__ void wait_all(const unsigned long long* counter) {
  if (threadIdx.x == 0) {
    const volatile unsigned long long* c = counter;
    for (uint32_t polls = 0; *c < gridDim.x; ++polls)
      if (polls == (1u << 30)) __trap();               // seconds: a bug, not a wait
    __threadfence();
  }
  __syncthreads();                                      // every CTA's stores visible
}

// Leave: the last CTA out sets counters[0 .. S] (S barriers, then the exit count) back to 0.
__device__ __forceinline__ void leave(unsigned long long* counters, int S) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(counters + S, 1ull) == gridDim.x - 1) {
    for (int s = 0; s <= S; ++s) counters[s] = 0;
    __threadfence();
  }
}

// B rows of n bf16 from global (written in this launch by other CTAs) into shared rows
// `stride` bytes apart: 16 bytes a thread, past the L1.
template <int THREADS>
__device__ __forceinline__ void rows_in(unsigned char* smem, uint32_t dst, int stride,
                                        const __nv_bfloat16* src, int B, int n) {
  for (int i = threadIdx.x; i < B * (n / 8); i += THREADS) {
    const int b = i / (n / 8), j = i % (n / 8);
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src + (size_t)b * n) + j);
    *reinterpret_cast<uint4*>(smem + dst + b * stride + 16 * j) = v;
  }
}

template <int WARPS, bool PDL, bool O>
__global__ void __launch_bounds__(WARPS * 32) mlp_chain(const Chain a) {
  constexpr int R = 8 * WARPS, THREADS = 32 * WARPS;   // one n8 tile a warp
  constexpr int S = O ? 2 : 1;                          // grid barriers a launch
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ float scratch[9];                          // norm_row's
  const int B = a.B, H = a.H, I = a.I, KO = a.KO;
  const int ws1 = 2 * H + 16, ws2 = 2 * I + 16, wso = 2 * KO + 16;   // bytes a shared row
  // barriers: gate|up quarters 0-3, x 4, down quarters 5-8, o quarters 9-12, O's inputs 13
  const uint32_t bars = smem_u32(smem), xbar = bars + 32, dbar = bars + 40, obar = bars + 72;
  const uint32_t nbar = bars + 104;
  const uint32_t gsm = 128, dsm = gsm + 2 * R * ws1, xsm = dsm + R * ws2, asm_ = xsm + B * ws1;
  const uint32_t osm = asm_ + B * ws2, qsm = osm + R * wso, wsm_ = qsm + B * wso;
  const uint32_t hsm = wsm_ + 8 * H, ysm = hsm + 2 * B * H;   // (O) h rows, o rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * R;
  const bool has_o = O && n0 < H, up = n0 < I, down = n0 < H;   // this CTA's items
  const int rows_o = has_o ? min(R, H - n0) : 0, rows1 = up ? min(R, I - n0) : 0;
  const int rows2 = down ? min(R, H - n0) : 0;

  if (threadIdx.x == 0) {
    for (int c = 0; c < 14; ++c) mbar_init(bars + 8 * c, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int c = 0; c < CHUNKS; ++c) {
      if (up) mbar_expect(bars + 8 * c, 2 * rows1 * (H / CHUNKS) * 2);
      if (down) mbar_expect(dbar + 8 * c, rows2 * (I / CHUNKS) * 2);
      if (has_o) mbar_expect(obar + 8 * c, rows_o * (KO / CHUNKS) * 2);
    }
    if (has_o) mbar_expect(xbar, B * KO * 2);
    else if (up && !O) mbar_expect(xbar, B * H * 2);
    if (O && up) mbar_expect(nbar, 8 * H + 2 * B * H);   // w_post, w_next, h
  }
  __syncthreads();
  if (has_o) copy_slab<1, R, 2, THREADS>(bars + osm, obar, wso, a.wo, H, KO, n0, rows_o, 0, KO / CHUNKS);
  if (up) copy_slab<2, R, 2, THREADS>(bars + gsm, bars, ws1, a.wgu, I, H, n0, rows1, 0, H / CHUNKS);
  if (down) copy_slab<1, R, 2, THREADS>(bars + dsm, dbar, ws2, a.wd, H, I, n0, rows2, 0, I / CHUNKS);
  if (O && up && threadIdx.x == 0) {                    // the norm's weights: no input either
    bulk_copy(bars + wsm_, a.na.w_post, 4 * H, nbar);
    bulk_copy(bars + wsm_ + 4 * H, a.na.w_next, 4 * H, nbar);
  }
  if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");   // x (and h): the kernels before's
  if (O) {
    if (up && threadIdx.x == 0) bulk_copy(bars + hsm, a.na.h, 2 * B * H, nbar);
    if (has_o) {
      if ((int)threadIdx.x < B) bulk_copy(bars + qsm + threadIdx.x * wso, a.x + (size_t)threadIdx.x * KO, KO * 2, xbar);
      mbar_wait(xbar, 0);
      float acc[1][1][4];
      slab_sums<1, 1, false, R>(acc, smem, obar, qsm, wso, osm, wso, B, KO / CHUNKS);
      store_tile<1, 1, PLAIN, false>(acc, a.o, nullptr, B, H, n0 + warp * 8, 0, g, t);
    }
    arrive(a.counter);
    if (up) {
      wait_all(a.counter);
      rows_in<THREADS>(smem, ysm, 2 * H, a.o, B, H);
      mbar_wait(nbar, 0);
      __syncthreads();                                  // o rows in, h and weights landed
      NormArgs sa = a.na;                               // its operands, from shared memory
      sa.w_post = reinterpret_cast<const float*>(smem + wsm_);
      sa.w_next = reinterpret_cast<const float*>(smem + wsm_ + 4 * H);
      sa.h = reinterpret_cast<const __nv_bfloat16*>(smem + hsm);
      sa.d1 = smem + ysm;
      for (int b = 0; b < B; ++b)
        norm_row<THREADS>(sa, b, B, H, reinterpret_cast<__nv_bfloat16*>(smem + xsm + b * ws1),
                          scratch, blockIdx.x == 0);
      __syncthreads();                                  // x rows made
    }
  } else if (up) {
    if ((int)threadIdx.x < B) bulk_copy(bars + xsm + threadIdx.x * ws1, a.x + (size_t)threadIdx.x * H, H * 2, xbar);
    mbar_wait(xbar, 0);
  }
  if (up) {
    float acc[2][1][4];
    slab_sums<2, 1, false, R>(acc, smem, bars, xsm, ws1, gsm, ws1, B, H / CHUNKS);
    store_tile<2, 1, GLU, false>(acc, a.act, nullptr, B, I, n0 + warp * 8, 0, g, t);
  }
  arrive(a.counter + S - 1);
  if (PDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (down) {
    wait_all(a.counter + S - 1);
    rows_in<THREADS>(smem, asm_, ws2, a.act, B, I);
    __syncthreads();
    float acc[1][1][4];
    slab_sums<1, 1, false, R>(acc, smem, dbar, asm_, ws2, dsm, ws2, B, I / CHUNKS);
    store_tile<1, 1, PLAIN, false>(acc, a.y, nullptr, B, H, n0 + warp * 8, 0, g, t);
  }
  leave(a.counter, S);
}

template <int WARPS, bool PDL, bool O>
int launch(const Chain& a, cudaStream_t stream) {
  constexpr int R = 8 * WARPS;
  const size_t smem = chain_smem(R, a.B, a.KO, a.H, a.I, O);
  if (smem > 227 * 1024 - 64) return -2;               // (the static scratch: 36 bytes)
  auto* kern = mlp_chain<WARPS, PDL, O>;
  static size_t raised = 0;                             // the attribute, once per size
  if (smem > raised) {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return (int)e;
    raised = smem;
  }
  const int grid = (max(a.I, a.H) + R - 1) / R;
  int dev = 0, sms = 0, per_sm = 0;                     // the spin barriers need every CTA
  cudaGetDevice(&dev);                                  // resident at once
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 32 * WARPS, smem);
  if (e != cudaSuccess) return (int)e;
  if (grid > per_sm * sms) return -3;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(32 * WARPS);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = PDL ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, kern, a);
}

template <bool O>
int launch_size(const Chain& a, int warps, int pdl, cudaStream_t s) {
  switch (warps) {
    case 1: return pdl ? launch<1, true, O>(a, s) : launch<1, false, O>(a, s);
    case 2: return pdl ? launch<2, true, O>(a, s) : launch<2, false, O>(a, s);
    case 4: return pdl ? launch<4, true, O>(a, s) : launch<4, false, O>(a, s);
    default: return -1;
  }
}

bool bad_shape(int B, int H, int I) {
  return B < 1 || B > 16 || H % 64 || I % 64 || H <= 0 || I <= 0;
}

}  // namespace

// y = dot_rows(dot_rows(x, wgu, glu, gelu), wd): x bf16 [B, H], wgu bf16 [2I, H] (gate rows,
// then up rows), wd bf16 [H, I]; act bf16 [B, I] (gate|up's output, a scratch the launch
// fills), y bf16 [B, H]; counter: three uint64 in device memory (zero at first, and zero again
// when a launch ends: launches on one stream may share them).  warps: 1, 2 or 4 (R = 8 warps columns a
// CTA).  0 on success; -1 a shape it does not take, -2 too much shared memory, -3 the grid
// cannot be resident at once (a barrier would deadlock), else a cudaError_t.
extern "C" int mlp_chain_launch(const void* x, const void* wgu, const void* wd, void* act,
                                void* y, void* counter, int B, int H, int I, int warps, int pdl,
                                void* stream) {
  if (bad_shape(B, H, I)) return -1;
  Chain a = {};
  a.x = (const __nv_bfloat16*)x;
  a.wgu = (const __nv_bfloat16*)wgu;
  a.wd = (const __nv_bfloat16*)wd;
  a.act = (__nv_bfloat16*)act;
  a.y = (__nv_bfloat16*)y;
  a.counter = (unsigned long long*)counter;
  a.B = B, a.H = H, a.I = I, a.KO = 64;
  return launch_size<false>(a, warps, pdl, (cudaStream_t)stream);
}

// The same after o and the add+norm: o = dot_rows(x, wo) (x the attention's rows [B, KO]),
// h' = h + norm(o, w_post) into h_out, the MLP's x = norm(h', w_next) (add_norm's row: RMS,
// eps; tw, block: add_norm's warps and BLOCK for H), then y as mlp_chain_launch's; o: a scratch
// [B, H] the launch fills.  Return codes as mlp_chain_launch's.
extern "C" int o_mlp_chain_launch(const void* x, const void* wo, void* o, const void* h,
                                  const void* w_post, const void* w_next, void* h_out,
                                  float eps, int tw, int block, const void* wgu, const void* wd,
                                  void* act, void* y, void* counter, int B, int KO, int H, int I,
                                  int warps, int pdl, void* stream) {
  if (bad_shape(B, H, I) || KO % 64 || KO <= 0 || (tw != 4 && tw != 8) || block < H ||
      block & (block - 1) || block < 8 * 32 * tw || warps > tw ||
      ((uintptr_t)h | (uintptr_t)w_post | (uintptr_t)w_next) & 15)
    return -1;   // add_norm's tree as norm_row replays it; 16-byte aligned bulk-copy sources
  Chain a = {};
  a.x = (const __nv_bfloat16*)x;
  a.wo = (const __nv_bfloat16*)wo;
  a.o = (__nv_bfloat16*)o;
  a.na = NormArgs{(const __nv_bfloat16*)h, nullptr, (const float*)w_post, (const float*)w_next,
                  (__nv_bfloat16*)h_out, nullptr, eps, 0, tw, block};
  a.wgu = (const __nv_bfloat16*)wgu;
  a.wd = (const __nv_bfloat16*)wd;
  a.act = (__nv_bfloat16*)act;
  a.y = (__nv_bfloat16*)y;
  a.counter = (unsigned long long*)counter;
  a.B = B, a.KO = KO, a.H = H, a.I = I;
  return launch_size<true>(a, warps, pdl, (cudaStream_t)stream);
}
