"""What merging split partials through a thread-block cluster's shared memory would save (CUDA).

The decode attention's ~11 us a launch are a chain of dependent trips (benchmarks/NOTES.md,
forty-fifth session): each split parks its partial in global memory, counts itself with an
atomic, and the last to arrive loads every partial back and folds them.  On Hopper the splits
of one row can be one cluster (8 CTAs portable, 16 with the non-portable attribute) whose
shared memory the others read (DSMEM): each split leaves its partial in its own shared memory,
the cluster meets at one barrier, and rank 0 folds the partials where they are.

Three launches of S CTAs a row (R rows), each CTA reading its [4, 256] float32 slice of x and
making a partial of it, timed as 20 launches in a CUDA graph (us a launch):

    alone    each CTA stores its partial and leaves        (the floor: no merge)
    park     stores it, fences, counts itself (atomicAdd); the last CTA of the row loads the S
             partials in order, sums them, stores the row, resets the count  (today's chain,
             one level)
    cluster  keeps it in shared memory; barrier.cluster; rank 0 reads the S partials in order
             through DSMEM, sums them, stores the row; a second barrier keeps the others'
             shared memory alive until it has read them

park and cluster add in the same order, so their rows are equal bit for bit (checked).  Built
with nvcc (sm_90a) into the muser cache; needs an sm_90 GPU to run.

    PYTHONPATH=. python3 benchmarks/cluster_merge_probe.py [--rows 1,8] [--splits 8,16]
"""
import argparse
import ctypes

import torch

from decode_attn_probe import graph_us      # 20 launches in a CUDA graph, replayed: us a launch
from nvcc_so import build_so

G, D = 4, 256                     # a 1B-shape row: 4 query heads of one KV head, D 256
SRC = r"""
#include <cooperative_groups.h>
#include <cuda_runtime.h>
namespace cg = cooperative_groups;
constexpr int N = %(N)d, T = 128, E = N / T;          // floats a partial, threads, a thread's

__device__ __forceinline__ void partial(const float* x, float* p) {
  const float* row = x + (size_t)blockIdx.x * N;      // this CTA's slice: its "tile"
  for (int e = 0; e < E; ++e) p[e] = row[threadIdx.x + e * T] * 2.0f + 1.0f;
}

__global__ void alone(const float* x, float* ws) {
  float p[E]; partial(x, p);
  for (int e = 0; e < E; ++e) ws[(size_t)blockIdx.x * N + threadIdx.x + e * T] = p[e];
}

__global__ void park(const float* x, float* ws, int* cnt, float* out, int S) {
  __shared__ int last;
  float p[E]; partial(x, p);
  for (int e = 0; e < E; ++e) ws[(size_t)blockIdx.x * N + threadIdx.x + e * T] = p[e];
  __threadfence();
  __syncthreads();
  int r = blockIdx.x / S;
  if (threadIdx.x == 0) last = atomicAdd(cnt + r, 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  float acc[E] = {};
  for (int j = 0; j < S; ++j) {
    const volatile float* q = ws + (size_t)(r * S + j) * N;
    for (int e = 0; e < E; ++e) acc[e] += q[threadIdx.x + e * T];
  }
  for (int e = 0; e < E; ++e) out[(size_t)r * N + threadIdx.x + e * T] = acc[e];
  if (threadIdx.x == 0) cnt[r] = 0;
}

__global__ void cluster(const float* x, float* out) {
  __shared__ float buf[N];
  cg::cluster_group c = cg::this_cluster();
  float p[E]; partial(x, p);
  for (int e = 0; e < E; ++e) buf[threadIdx.x + e * T] = p[e];
  c.sync();
  if (c.block_rank() == 0) {
    float acc[E] = {};
    for (unsigned j = 0; j < c.num_blocks(); ++j) {
      const float* q = c.map_shared_rank(buf, j);
      for (int e = 0; e < E; ++e) acc[e] += q[threadIdx.x + e * T];
    }
    int r = blockIdx.x / c.num_blocks();
    for (int e = 0; e < E; ++e) out[(size_t)r * N + threadIdx.x + e * T] = acc[e];
  }
  c.sync();                       // the others' shared memory lives until rank 0 has read it
}

extern "C" int alone_launch(const float* x, float* ws, int R, int S, cudaStream_t st) {
  alone<<<R * S, T, 0, st>>>(x, ws);
  return (int)cudaGetLastError();
}

extern "C" int park_launch(const float* x, float* ws, int* cnt, float* out, int R, int S,
                           cudaStream_t st) {
  park<<<R * S, T, 0, st>>>(x, ws, cnt, out, S);
  return (int)cudaGetLastError();
}

extern "C" int cluster_launch(const float* x, float* out, int R, int S, cudaStream_t st) {
  if (S > 8) {
    cudaError_t e = cudaFuncSetAttribute(cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return (int)e;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(R * S); cfg.blockDim = dim3(T); cfg.stream = st;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeClusterDimension;
  a[0].val.clusterDim.x = S; a[0].val.clusterDim.y = 1; a[0].val.clusterDim.z = 1;
  cfg.attrs = a; cfg.numAttrs = 1;
  return (int)cudaLaunchKernelEx(&cfg, cluster, x, out);
}
""" % {"N": G * D}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--splits", default="8,16")
    ap.add_argument("--build-only", action="store_true", help="compile, then stop (no GPU)")
    a = ap.parse_args()
    so = build_so("cluster_merge", SRC)
    if a.build_only:
        print(f"built {so}")
        return
    lib = ctypes.CDLL(str(so))
    for f in (lib.alone_launch, lib.park_launch, lib.cluster_launch):
        f.restype = ctypes.c_int
    print(f"# {torch.cuda.get_device_name()}; a partial of {G} x {D} float32 a CTA, 128 threads")
    print("| rows x splits | alone | park + atomic + fold | cluster + DSMEM fold | equal |")
    print("|---|---:|---:|---:|---|")
    for R in (int(r) for r in a.rows.split(",")):
        for S in (int(s) for s in a.splits.split(",")):
            x = torch.randn(R * S, G * D, device="cuda")
            ws = torch.empty_like(x)
            cnt = torch.zeros(R, dtype=torch.int32, device="cuda")
            o1, o2 = torch.empty(R, G * D, device="cuda"), torch.empty(R, G * D, device="cuda")
            p = lambda t: ctypes.c_void_p(t.data_ptr())                            # noqa: E731
            st = lambda: ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)  # noqa: E731

            def run(name, *args):
                def fn():
                    rc = getattr(lib, name)(*args, ctypes.c_int(R), ctypes.c_int(S), st())
                    if rc:
                        raise SystemExit(f"{name}: CUDA error {rc}")
                return graph_us(fn, replays=50)
            t_alone = run("alone_launch", p(x), p(ws))
            t_park = run("park_launch", p(x), p(ws), p(cnt), p(o1))
            t_cl = run("cluster_launch", p(x), p(o2))
            torch.cuda.synchronize()
            want = torch.zeros(R, G * D, device="cuda")
            for j in range(S):              # the kernels' order (x * 2 is exact: no FMA doubt)
                want += (x * 2 + 1).view(R, S, -1)[:, j]
            same = torch.equal(o1, want) and torch.equal(o2, want)
            print(f"| {R} x {S} | {t_alone:.2f} | {t_park:.2f} | {t_cl:.2f} | {same} |")


if __name__ == "__main__":
    main()
