"""Interleave: how much a near-max-context prompt slows a stream that is already running.

For each --prefill-share value, starts `muser serve` (a child process on
127.0.0.1), starts one greedy streaming completion (a counting prompt, so it
does not stop early), waits until it has produced --warm tokens, then sends a
completion whose prompt is --long tokens (max_tokens 1).  Reports the stream's
tokens/s before the long prompt arrived and while it was being prefilled
(arrival to its answer), the slowdown (before / during) and the long prompt's
time to answer.  `--prefill-share 1` is the old schedule (a chunk every round).

    python benchmarks/interleave.py                          # gemma3-270m, 4096 context
    python benchmarks/interleave.py --model tiny --long 200 --max-context 256
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from serverproc import free_port, launch, stop  # noqa: E402


def serve(args, share: float) -> tuple[subprocess.Popen, str, str]:
    model, name = args.model, args.model
    if model == "tiny":
        from muser.testing import tiny_model_dir
        model, name = str(tiny_model_dir()), "tiny"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = launch([sys.executable, "-m", "muser.cli", "serve", "--model", model,
                   "--port", str(port), "--served-name", name, "--slots", "2",
                   "--max-context", str(args.max_context), "--output-reserve", "64",
                   "--prefill-share", str(share), "--log-level", "warning"],
                  base, timeout=300, stdout=subprocess.DEVNULL, stderr=tempfile.TemporaryFile())
    return proc, base, name


def measure(args, share: float) -> dict:
    proc, base, name = serve(args, share)
    try:
        stamps: list[float] = []
        done = threading.Event()

        def stream():
            with httpx.stream("POST", base + "/v1/completions", timeout=900, json={
                    "model": name, "prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": args.stream_tokens,
                    "temperature": 0, "stream": True}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        stamps.append(time.perf_counter())
                    if done.is_set():
                        break
        t = threading.Thread(target=stream)
        t.start()
        while len(stamps) < args.warm:
            time.sleep(0.01)
        vocab = 300 if args.model == "tiny" else 262144
        ids = [2] + [10 + (i * 7919) % (vocab - 10) for i in range(args.long - 1)]
        t_in = time.perf_counter()
        httpx.post(base + "/v1/completions", timeout=900,
                   json={"model": name, "prompt": ids, "max_tokens": 1, "temperature": 0})
        t_out = time.perf_counter()
        time.sleep(0.5)
        done.set()
        t.join()
    finally:
        stop(proc, 30)
    before = [s for s in stamps if s < t_in][-args.warm // 2:]
    during = [s for s in stamps if t_in <= s <= t_out]
    rate = lambda xs: (len(xs) - 1) / (xs[-1] - xs[0]) if len(xs) > 1 else 0.0   # noqa: E731
    r0, r1 = rate(before), (len(during) / (t_out - t_in))
    return {"prefill_share": share, "before_tok_s": round(r0, 1), "during_tok_s": round(r1, 2),
            "slowdown": round(r0 / r1, 1) if r1 else float("inf"),
            "long_prompt_s": round(t_out - t_in, 1), "stream_finished_during": stamps[-1] <= t_out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--long", type=int, default=4000, help="tokens of the long prompt")
    ap.add_argument("--warm", type=int, default=20, help="stream tokens before the long prompt")
    ap.add_argument("--stream-tokens", type=int, default=3000)
    ap.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = [measure(args, s) for s in args.shares]
    print(f"| --prefill-share | stream tok/s before | during the {args.long}-token prompt | "
          "slowdown | long prompt answered in (s) |\n|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['prefill_share']:g} | {r['before_tok_s']} | {r['during_tok_s']} | "
              f"{r['slowdown']}x | {r['long_prompt_s']} |")
    print(f"load average: {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
