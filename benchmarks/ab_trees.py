"""Same run, two source trees: CPU step cost and output bits of the default configuration.

Each tree is measured in its own subprocesses (PYTHONPATH = the tree), alternating A B A B ...
so that load on the machine falls on both alike; figures are medians over the rounds.  Every
subprocess also hashes the logits it produced: equal hashes mean the two trees computed the
same bits for the same calls.

    git archive main | tar -x -C /tmp/muser_main
    python benchmarks/ab_trees.py --tree before=/tmp/muser_main --tree after=. --rounds 5

Measured per round (muser.load defaults: CPU bf16 activations + int8): decode ms/token after a
16- and a 512-token prompt, a batched decode step of 4 sessions, a verification block (extend of
8), prefill of 512 tokens in one chunk.  `--model embedded` (gemma3-270m) or `tiny` (the test
model: 6 layers of 64, where a step is almost all Python and dispatch -- the engine's own
per-step overhead).  `--clock process` counts the process's CPU time instead of wall time: on a
machine shared with other jobs, time spent waiting for a core then does not count (run with
--threads 1 so no thread spins).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import hashlib, json, statistics, sys, time
import torch
import muser
if sys.argv[2] == "tiny":
    from muser.testing import tiny_model
    engine = tiny_model("gemma3", dtype="bfloat16", quant="int8", tokenizer=False, max_context=1024)
    ids = [(7 * i) % 370 + 5 for i in range(600)]
else:
    engine = muser.load("gemma3-270m", progress=False)
    ids = [(7 * i) % 5000 + 100 for i in range(600)]
clock = time.process_time if sys.argv[3] == "process" else time.perf_counter
digest = hashlib.sha256()

def note(t):
    digest.update(t.float().contiguous().numpy().tobytes())

def decode_ms(prompt, n):
    s = engine.new_session()
    note(s.prefill(prompt))
    tok = ids[-1]
    note(s.decode(tok))                                  # warm-up step
    t = clock()
    for _ in range(n):
        out = s.decode(tok)
        tok = int(out.argmax())
    dt = (clock() - t) / n
    note(out)
    return dt * 1e3

out = {}
warm = engine.new_session(); warm.prefill(ids[:64]); warm.decode(5)
out["decode_16_ms"] = decode_ms(ids[:16], int(sys.argv[1]))
out["decode_512_ms"] = decode_ms(ids[:512], int(sys.argv[1]))
ss = [engine.new_session() for _ in range(4)]
for i, s in enumerate(ss):
    s.prefill(ids[i * 10: i * 10 + 20 + i])
engine.decode_batch(ss, [5, 6, 7, 8])
t = clock()
for k in range(16):
    note(engine.decode_batch(ss, [9 + k, 10 + k, 11 + k, 12 + k]))
out["batch4_step_ms"] = (clock() - t) / 16 * 1e3
s = engine.new_session(); s.prefill(ids[:200])
times = []
for k in range(8):
    cp = s.checkpoint(8)
    t = clock()
    note(s.extend(ids[300 + k: 308 + k]))
    times.append(clock() - t)
    s.rollback(cp, 1)
out["verify8_ms"] = statistics.median(times) * 1e3
times = []
for k in range(3):
    s = engine.new_session()
    t = clock()
    note(s.prefill(ids[:512]))
    times.append(clock() - t)
out["prefill512_tok_s"] = 512 / statistics.median(times)
out["logits_sha256"] = digest.hexdigest()[:16]
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH (two or more)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default="embedded", choices=["embedded", "tiny"])
    ap.add_argument("--clock", default="wall", choices=["wall", "process"])
    args = ap.parse_args()
    trees = [t.split("=", 1) for t in args.tree]
    runs: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, path in trees:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(path), "OMP_NUM_THREADS": str(args.threads)}
            p = subprocess.run([sys.executable, "-c", CHILD, str(args.decode_tokens), args.model, args.clock],
                               env=env,
                               capture_output=True, text=True, cwd=os.path.abspath(path))
            if p.returncode != 0:
                raise SystemExit(f"{name}: {p.stderr[-3000:]}")
            runs[name].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r} {name}: {runs[name][-1]}", flush=True)
    keys = [k for k in runs[trees[0][0]][0] if k != "logits_sha256"]
    print("\n| tree | " + " | ".join(keys) + " | logits sha256 |")
    print("|---|" + "---|" * (len(keys) + 1))
    for name, _ in trees:
        med = {k: statistics.median(x[k] for x in runs[name]) for k in keys}
        shas = sorted({x["logits_sha256"] for x in runs[name]})
        print(f"| {name} | " + " | ".join(f"{med[k]:.2f}" for k in keys) + f" | {', '.join(shas)} |")


if __name__ == "__main__":
    main()
