"""muser on CUDA vs transformers vs the bandwidth floor, in one run on one GPU.

Builds random-weight models at real shapes with transformers (Gemma-3-1B, Gemma-3-4B and a
Cohere2-style NoPE hybrid), saves them (safetensors, /dev/shm), loads them with
`muser.load(dir, device="cuda", dtype="bfloat16")`, and measures, in the same process:
  * the floor: weight bytes / device-to-device copy bandwidth (measured here, read + write);
  * batch-1 decode ms/token at 2k and 32k context (the API path: `session.decode` + argmax
    read back every token) and the bare graph replay;
  * 16 sessions decoding together at 2k (`engine.decode_batch`), tokens/s;
  * prefill of a 16k-token prompt, tokens/s (muser with the engine's default CUDA chunk, and with
    4k chunks; transformers one forward);
  * transformers (same weights, sdpa, bf16) for the same decode and prefill;
  * KV bytes allocated vs `muser.cache.plan`; a logits cross-check muser vs transformers;
  * with --llama-bin (llama.cpp's CUDA build, ../shared/peers/llama-cpp-cuda/): the same weights
    converted by llama.cpp's converter and run by llama-bench / llama-batched-bench in the same
    run (llama_cuda_peer.py), and one side-by-side table: muser, llama.cpp, transformers, floor.

    PYTHONPATH=. python3 benchmarks/cuda_bench.py [--models 1b,4b,cohere2] [--out DIR]
        [--llama-bin /tmp/lb/bin --llama-src /tmp/llama-strip --llama-tokenizer tokenizer.model]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

from llama_cuda_peer import available, bench, convert
from muser.engine.loader import QUANTS
from cuda_measure import (copy_bandwidth, build, cross_check, hf_decode, hf_prefill, kv_check,
                          muser_batch, muser_decode, muser_prefill, muser_ttft, prefill_profile)

SHAPES = {
    "270m": dict(arch="gemma3", layers=18, hidden=640, heads=4, kv=1, head_dim=256, window=512,
                 ffn=2048, vocab=262144, pattern=6, long=32768),
    "1b": dict(arch="gemma3", layers=26, hidden=1152, heads=4, kv=1, head_dim=256, window=512,
               ffn=6912, vocab=262144, pattern=6, long=32768),
    "4b": dict(arch="gemma3", layers=34, hidden=2560, heads=8, kv=4, head_dim=256, window=1024,
               ffn=10240, vocab=262208, pattern=6, long=32768),
    "cohere2": dict(arch="cohere2", layers=16, hidden=2048, heads=16, kv=4, head_dim=128, window=4096,
                    ffn=8192, vocab=256000, pattern=4, long=0),
}
LOG = []
ATTN_AB = [{}, {"MUSER_GROWING_ROWS": "256"}, {"MUSER_RING_GROUP": "4"}, {"MUSER_MERGE_LOADS": "4"},
           {"MUSER_ATTN_GROWING": "64,8", "MUSER_GROWING_ROWS": "128"},
           {"MUSER_RING_ROWS": "64", "MUSER_ATTN_RING": "64,8"},
           {"MUSER_ATTN_RING": "16,4", "MUSER_ATTN_GROWING": "16,4"}]


def log(*a):
    line = " ".join(str(x) for x in a)
    LOG.append(line)
    print(line, flush=True)


def run_model(name, shape, bw, args, results):
    import muser
    from muser.env import read as read_env
    t0 = time.perf_counter()
    ctx = max(shape["long"], args.prefill) + 1024
    model, path = build(shape, ctx)
    engine = muser.load(path, device="cuda", dtype="bfloat16", progress=False,
                        quant=args.quant)
    r = results[name] = {"shape": shape, "setup_s": round(time.perf_counter() - t0, 1),
                         "quant": args.quant}
    wbytes = engine.weights.nbytes()
    r["weight_bytes"] = wbytes
    r["floor_ms"] = wbytes / bw * 1e3
    vocab = shape["vocab"]

    def section(key, fn):
        try:
            t = time.perf_counter()
            r[key] = fn()
            log(f"  {name} {key}: {r[key]}  ({time.perf_counter() - t:.1f}s)")
        except Exception as e:                            # keep going; report the miss
            r[key] = f"ERROR {type(e).__name__}: {e}"[:300]
            log(f"  {name} {key}: {r[key]}")
            traceback.print_exc()

    section("cross_check", lambda: cross_check(engine, model, vocab))
    # rings allocate their whole capacity up front: compare where the plan's rings are full too
    section("kv_plan_2k", lambda: kv_check(engine, max(2048, shape["window"]) + 64))
    section("decode_2k", lambda: muser_decode(engine, 2048, args.steps, vocab)[:2])
    # the headline figures first, all through the engine's first runner (a runner rebuilt for an
    # A/B below has measured 0.04-0.15 ms/token more host time with the same GPU time)
    if shape["long"] and not args.quick:
        section("decode_32k", lambda: muser_decode(engine, shape["long"], args.steps, vocab)[:2])
    if name in ("270m", "1b"):
        section("batch16_2k", lambda: muser_batch(engine, 16, 2048, 32, vocab, prof=args.profile))
        section("hf_batch16_2k", lambda: 16 / hf_decode(model, 16, 2048, 8, vocab))
    if args.profile and name in ("1b", "4b"):
        section("profile_b1", lambda: muser_decode(engine, 2048, 16, vocab, prof=True)[2])
        for gemv, attn in (("none", "fused"), ("fast", "fused"), ("dot", "separate"),
                           ("dot", "fused")):                # A/B switches (backends/cuda/decode_step.py)
            os.environ["MUSER_GEMV"], os.environ["MUSER_ATTN"] = gemv, attn
            engine.backend.reset_runner(read_env())       # a fresh runner with the mode
            section(f"decode_2k_gemv_{gemv}_attn_{attn}",
                    lambda: muser_decode(engine, 2048, args.steps, vocab)[:2])
        os.environ.pop("MUSER_GEMV")
        os.environ.pop("MUSER_ATTN")
        engine.backend.reset_runner()
    if args.attn_ab and name in ("1b", "4b"):
        for i, env in enumerate(ATTN_AB):                 # decode attention settings (triton_decode)
            os.environ.update(env)
            engine.backend.reset_runner(read_env())
            section(f"attn_ab{i}_2k {env}", lambda: muser_decode(engine, 2048, args.steps, vocab)[:2])
            section(f"attn_ab{i}_32k {env}",
                    lambda: muser_decode(engine, shape["long"], args.steps, vocab)[:2])
            for k in env:
                os.environ.pop(k)
        engine.backend.reset_runner()
    r["default_chunk"] = engine.config.chunk_size
    section("prefill_16k_default", lambda: muser_prefill(engine, args.prefill, vocab, None))
    if not args.quick:
        section("prefill_16k_chunk4096", lambda: muser_prefill(engine, args.prefill, vocab, 4096))
    if args.prefill_profile:
        section("prefill_profile", lambda: prefill_profile(engine, args.prefill, vocab))
    section("prefill_512", lambda: max(muser_prefill(engine, 512, vocab, None, reps=3) for _ in range(2)))
    section("ttft_512", lambda: muser_ttft(engine, 512, vocab))
    section("hf_prefill_16k", lambda: hf_prefill(model, args.prefill, vocab))
    section("hf_decode_2k", lambda: hf_decode(model, 1, 2048, 16, vocab))
    if available(args.llama_bin):
        gguf = os.path.join(os.path.dirname(path), f"llama-{name}.gguf")
        section("llama", lambda: bench(convert(path, gguf, args.llama_src, args.llama_tokenizer),
                                       args.llama_bin, long=0 if args.quick else shape["long"],
                                       batched=name in ("270m", "1b")))
    r["attention_routes"] = dict(engine.backend.attention.stats)
    r["runner"] = dict(engine.decode_runner().stats)
    log(f"  {name} routes {r['attention_routes']} runner {r['runner']} flash_error "
        f"{engine.backend.attention.last_error}")


def fmt(x, f="{:.3f}"):
    return f.format(x) if isinstance(x, (int, float)) else str(x)[:40]


def table(results, bw):
    log(f"\ncopy bandwidth (read+write) {bw / 1e12:.2f} TB/s on {torch.cuda.get_device_name()}")
    log("| model | weights GB | floor ms | muser ms/tok 2k (bare replay) | 32k | 32k/2k | HF ms/tok 2k "
        "| muser prefill 16k tok/s default chunk (size) / c4096 | HF tok/s | x (default chunk) | B16 tok/s (HF) | KV = plan | xcheck |")
    for name, r in results.items():
        g = lambda k: r.get(k, "-")                                       # noqa: E731
        d2, d32, kv, b16 = g("decode_2k"), g("decode_32k"), g("kv_plan_2k"), g("batch16_2k")
        ok = lambda v: isinstance(v, (list, tuple))                       # noqa: E731
        ms = lambda v, i=0: fmt(v[i] * 1e3) if ok(v) else str(v)[:40]      # noqa: E731
        ratio = d32[0] / d2[0] if ok(d2) and ok(d32) else "-"
        pd, hp = g("prefill_16k_default"), g("hf_prefill_16k")
        x = pd / hp if isinstance(pd, float) and isinstance(hp, float) else "-"
        hd = g("hf_decode_2k")
        log(f"| {name} | {r['weight_bytes'] / 1e9:.2f} | {r['floor_ms']:.3f} | {ms(d2)} ({ms(d2, 1)}) | "
            f"{ms(d32)} | {fmt(ratio)} | {fmt(hd * 1e3) if isinstance(hd, float) else hd} | "
            f"{fmt(pd, '{:,.0f}')} ({g('default_chunk')}) / {fmt(g('prefill_16k_chunk4096'), '{:,.0f}')} | "
            f"{fmt(hp, '{:,.0f}')} | {fmt(x, '{:.2f}')} | "
            f"{fmt(b16[0], '{:,.0f}') if ok(b16) else b16} ({fmt(g('hf_batch16_2k'), '{:,.0f}')}) | "
            f"{(kv[0] == kv[1], kv[0]) if ok(kv) else kv} | {g('cross_check')} |")


def side_by_side(results):
    """One row per model and workload: muser, llama.cpp (when run), transformers, the floor."""
    log("\n| model | workload | muser | llama.cpp CUDA | transformers | floor |")
    log("|---|---|---:|---:|---:|---:|")
    first = lambda v: v[0] if isinstance(v, (list, tuple)) else v             # noqa: E731
    ms = lambda v: first(v) * 1e3 if isinstance(first(v), float) else None    # noqa: E731
    for name, r in results.items():
        lp = r.get("llama") if isinstance(r.get("llama"), dict) else {}
        long = r["shape"]["long"]
        rows = [("decode 2k, ms/token", ms(r.get("decode_2k")), lp.get("tg_2048_ms"),
                 ms(r.get("hf_decode_2k")), r["floor_ms"]),
                (f"decode {long}, ms/token", ms(r.get("decode_32k")), lp.get(f"tg_{long}_ms"), None, None),
                ("prefill 512, tok/s", r.get("prefill_512"), lp.get("pp512"), None, None),
                ("first token of a 512-token prompt, ms", ms(r.get("ttft_512")), None, None, None),
                ("prefill 16k, tok/s", r.get("prefill_16k_default"), lp.get("pp16384"),
                 r.get("hf_prefill_16k"), None),
                ("16 sessions @2k, tok/s", first(r.get("batch16_2k")), lp.get("b16_tg"),
                 r.get("hf_batch16_2k"), None)]
        for what, *vals in rows:
            if any(isinstance(v, float) for v in vals[:2]):
                f = "{:.3f}" if "ms" in what else "{:,.0f}"
                log(f"| {name} | {what} | "
                    + " | ".join(fmt(v, f) if isinstance(v, float) else "-" for v in vals) + " |")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="1b,4b,cohere2")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prefill", type=int, default=16384)
    ap.add_argument("--quick", action="store_true", help="skip 32k decode and the 4k-chunk prefill")
    ap.add_argument("--quant", default="none", choices=QUANTS,
                    help="muser's weights: bf16 (none), int8 rows, or the head alone as int8 "
                         "(backends/cuda/weights_int8.py)")
    ap.add_argument("--prefill-profile", action="store_true", help="kernel breakdown of one 16k prefill")
    ap.add_argument("--attn-ab", action="store_true", help="decode attention settings A/B, 2k and 32k")
    ap.add_argument("--profile", action="store_true", help="kernel breakdown + BLAS A/B (1b)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--llama-bin", help="llama.cpp CUDA binaries (llama-bench): run it side by side")
    ap.add_argument("--llama-src", default="/tmp/llama-strip", help="llama.cpp sources (the converter)")
    ap.add_argument("--llama-tokenizer", default="/tmp/tok/tokenizer.model",
                    help="tokenizer.model for the converter (peers/llama-cpp-cuda/make_tokenizer.py)")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    log("torch", torch.__version__, "device", torch.cuda.get_device_name(), "date",
        time.strftime("%Y-%m-%d %H:%M"), "argv", " ".join(sys.argv[1:]))
    bw = copy_bandwidth()
    results = {}
    for name in args.models.split(","):
        log(f"== {name}")
        try:
            run_model(name, SHAPES[name], bw, args, results)
        except Exception as e:
            log(f"  {name} FAILED {type(e).__name__}: {e}")
            traceback.print_exc()
        torch.cuda.empty_cache()
        with open(os.path.join(args.out, "cuda_bench.json"), "w") as f:
            json.dump({"bandwidth": bw, "results": results}, f, indent=1, default=str)
    table(results, bw)
    side_by_side(results)
    with open(os.path.join(args.out, "cuda_bench.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    main()
