"""CPU speed of the embedded Gemma 3 270M: muser (each CPU mode) vs transformers vs llama.cpp.

Every runner is warmed up first (a 600-token prefill and a decode step, untimed); every runner
gets the same token ids (the muser tokenizer's encoding of a fixed text, which
equals llama.cpp's and transformers' for this GGUF) and runs in its own subprocess, one after
the other, with the same thread count.  Figures: prefill tok/s at 512 and 2,048 tokens, decode
tok/s at short context (after 16 tokens) and after 2,048 tokens; median of --repeats runs.

    python benchmarks/cpu_bench.py                      # everything available
    python benchmarks/cpu_bench.py --only muser         # just muser's modes
    python benchmarks/cpu_bench.py --decode-tokens 32 --repeats 3 --json out.json
    # A/B against another checkout of muser (e.g. `git archive main | tar -x -C /tmp/base`),
    # in the same run, repeats interleaved runner by runner:
    python benchmarks/cpu_bench.py --only muser:bfloat16:int8,llama.cpp --baseline /tmp/base

llama.cpp is optional (`pip install -e ".[bench]"` compiles llama-cpp-python).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

TEXT = ("The history of computing is a story of layers: transistors became gates, gates became "
        "processors, processors ran operating systems, and languages grew on top of them. ") * 200
MUSER_MODES = [("float32", "none"), ("bfloat16", "none"), ("float32", "int8"), ("bfloat16", "int8")]


def token_ids(n: int) -> list[int]:
    from muser.engine.loader import resolve
    from muser.model.tokenizer import load_tokenizer
    _, path = resolve("gemma3-270m")
    ids = load_tokenizer(path).encode(TEXT)
    assert len(ids) >= n, len(ids)
    return ids[:n]


# --------------------------------------------------------------------------- runners
def run_muser(dtype: str, quant: str, ids: list[int], decode_tokens: int) -> dict:
    import muser
    engine = muser.load("gemma3-270m", dtype=dtype, quant=quant, progress=False)
    warm = engine.new_session()                   # one-time costs (kernel packing) stay out
    warm.prefill(ids[:600], chunk_size=512)
    warm.decode(1000)
    out = {}
    for n in (512, 2048):
        s = engine.new_session()
        t = time.perf_counter()
        s.prefill(ids[:n], chunk_size=512)
        out[f"prefill_{n}"] = n / (time.perf_counter() - t)
        if n == 2048:
            out["decode_2048"] = _decode_rate(s.decode, decode_tokens)
    s = engine.new_session()
    s.prefill(ids[:16])
    out["decode_16"] = _decode_rate(s.decode, decode_tokens)
    return out


def _decode_rate(step, n: int) -> float:
    import torch
    tok = 1000
    step(tok)                                     # warm-up
    t = time.perf_counter()
    for _ in range(n):
        tok = int(torch.argmax(step(tok)))
    return n / (time.perf_counter() - t)


def run_transformers(dtype: str, ids: list[int], decode_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from muser.engine.loader import resolve
    _, path = resolve("gemma3-270m")
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=getattr(torch, dtype), attn_implementation="sdpa")
    model.eval()
    out = {}
    with torch.inference_mode():
        r = model(torch.tensor([ids[:600]]), use_cache=True)        # warm-up
        _hf_decode(model, r.past_key_values, 2)
        for n in (512, 2048):
            x = torch.tensor([ids[:n]])
            t = time.perf_counter()
            r = model(x, use_cache=True)
            out[f"prefill_{n}"] = n / (time.perf_counter() - t)
            if n == 2048:
                out["decode_2048"] = _hf_decode(model, r.past_key_values, decode_tokens)
        r = model(torch.tensor([ids[:16]]), use_cache=True)
        out["decode_16"] = _hf_decode(model, r.past_key_values, decode_tokens)
    return out


def _hf_decode(model, pkv, n):
    import torch
    tok = torch.tensor([[1000]])
    t = None
    for i in range(n + 1):
        if i == 1:
            t = time.perf_counter()
        r = model(tok, past_key_values=pkv, use_cache=True)
        pkv = r.past_key_values
        tok = r.logits[:, -1].argmax(-1, keepdim=True)
    return n / (time.perf_counter() - t)


def run_llama_cpp(ids: list[int], decode_tokens: int, threads: int) -> dict:
    from llama_cpp import Llama
    from muser.engine.loader import resolve
    _, path = resolve("gemma3-270m")
    llm = Llama(model_path=str(path), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                n_batch=512, flash_attn=True, verbose=False)
    out = {}
    llm.eval(ids[:600])                            # warm-up
    for n in (512, 2048):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids[:n])
        out[f"prefill_{n}"] = n / (time.perf_counter() - t)
        if n == 2048:
            out["decode_2048"] = _llama_decode(llm, decode_tokens)
    llm.reset()
    llm.eval(ids[:16])
    out["decode_16"] = _llama_decode(llm, decode_tokens)
    return out


def _llama_decode(llm, n):
    import llama_cpp
    import numpy as np
    vocab = llm.n_vocab()
    tok = 1000
    llm.eval([tok])
    t = time.perf_counter()
    for _ in range(n):
        llm.eval([tok])
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
        tok = int(np.argmax(logits))                  # greedy, like the other runners
    return n / (time.perf_counter() - t)


# --------------------------------------------------------------------------- driver
def one(name: str, decode_tokens: int, threads: int) -> dict:
    import torch
    torch.set_num_threads(threads)
    ids = token_ids(2048)
    kind, *rest = name.split(":")
    if kind in ("muser", "baseline"):            # baseline: the same runner, muser from --baseline
        return run_muser(rest[0], rest[1], ids, decode_tokens)
    if kind == "transformers":
        return run_transformers(rest[0], ids, decode_tokens)
    if kind == "llama.cpp":
        return run_llama_cpp(ids, decode_tokens, threads)
    raise SystemExit(f"unknown runner {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help="comma-separated runner prefixes: muser | muser:bfloat16:int8 | "
                                                 "transformers | llama.cpp")
    ap.add_argument("--baseline", default=None, help="another muser checkout: adds baseline:<mode> runners for the "
                                                     "selected muser modes, importing muser from there")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.decode_tokens, args.threads)))
        return
    runners = [f"muser:{d}:{q}" for d, q in MUSER_MODES] + ["transformers:float32", "transformers:bfloat16"]
    try:
        import llama_cpp  # noqa: F401
        runners.append("llama.cpp")
    except ImportError:
        print("llama-cpp-python not installed: skipping llama.cpp (pip install -e '.[bench]')", file=sys.stderr)
    if args.only:
        runners = [r for r in runners if any(r.startswith(o) for o in args.only.split(","))]
    if args.baseline:
        runners += [r.replace("muser:", "baseline:") for r in runners if r.startswith("muser:")]
    # Repeats go round the runners (r1 r2 r3 r1 r2 r3 ...), so slow drift in what else the
    # machine is doing hits every runner alike.
    runs: dict[str, list[dict]] = {r: [] for r in runners}
    failed: set[str] = set()
    for _ in range(args.repeats):
        for r in runners:
            if r in failed:
                continue
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            if r.startswith("baseline:"):
                env["PYTHONPATH"] = os.path.abspath(args.baseline)
            p = subprocess.run([sys.executable, __file__, "--one", r, "--decode-tokens", str(args.decode_tokens),
                                "--threads", str(args.threads)], capture_output=True, text=True, env=env)
            if p.returncode != 0:
                print(f"{r} failed:\n{p.stderr[-2000:]}", file=sys.stderr)
                failed.add(r)
                continue
            runs[r].append(json.loads(p.stdout.strip().splitlines()[-1]))
    results = {}
    for r, rs in runs.items():
        if rs:
            results[r] = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
            print(f"{r:24s} " + "  ".join(f"{k} {v:8.1f}" for k, v in results[r].items()), flush=True)
    cols = ["prefill_512", "prefill_2048", "decode_16", "decode_2048"]
    print("\n| runner | " + " | ".join(c + " tok/s" for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r, v in results.items():
        print(f"| {r} | " + " | ".join(f"{v[c]:.1f}" for c in cols) + " |")
    ref = results.get("llama.cpp")
    if ref:
        print("\nratios vs llama.cpp:")
        for r, v in results.items():
            print(f"  {r:24s} " + "  ".join(f"{c} {v[c] / ref[c]:.2f}x" for c in cols))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
