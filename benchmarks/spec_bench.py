"""Prompt-lookup speculation vs plain greedy decoding on the embedded model.

Two workloads: an editing-style prompt (the answer is mostly a copy of text in the
prompt) and free-form text.  For each: tokens/s of plain greedy and of speculative
greedy (same model, same mode), whether the outputs are identical, acceptance rate and
tokens settled per target forward.  Median of --repeats.

    python benchmarks/spec_bench.py --dtype bfloat16 --quant int8 --block 8 --max-tokens 96
"""
from __future__ import annotations

import argparse
import statistics
import time

import muser

PASSAGE = ("The ring keeps the last W tokens of every sliding layer, so its memory is flat no matter "
           "how long the conversation grows. The growing plane keeps every token of the full layers, "
           "and that is where the memory of a long context goes. A snapshot leaves in logical order "
           "and comes back with the rotation rebuilt, so a restored session replays bit for bit.")
WORKLOADS = {
    "editing": f"Original text:\n{PASSAGE}\n\nThe same text, copied exactly:\n{PASSAGE[:60]}",
    "free-form": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}


def timed(engine, prompt, max_tokens, **kw):
    stats = {}
    t = time.perf_counter()
    out = list(engine.stream(prompt, max_tokens=max_tokens, stats=stats, **kw))
    return out, len(out) / (time.perf_counter() - t), stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quant", default="int8")
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    engine = muser.load("gemma3-270m", dtype=args.dtype, quant=args.quant, progress=False)
    print(f"| workload | plain tok/s | prompt-lookup tok/s | speedup | identical | acceptance | tokens/forward |")
    print("|---|---|---|---|---|---|---|")
    for name, prompt in WORKLOADS.items():
        plain, spec = [], []
        for _ in range(args.repeats):
            a, ra, _ = timed(engine, prompt, args.max_tokens)
            b, rb, st = timed(engine, prompt, args.max_tokens, speculative="prompt-lookup", block=args.block)
            plain.append(ra)
            spec.append(rb)
        p, s = statistics.median(plain), statistics.median(spec)
        print(f"| {name} | {p:.1f} | {s:.1f} | {s / p:.2f}x | {a == b} | {st.get('acceptance', 0):.0%} | "
              f"{st.get('tokens_per_forward', 0):.2f} |", flush=True)


if __name__ == "__main__":
    main()
