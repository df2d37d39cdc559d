"""n=4 in one request vs four separate requests: time until every choice has its first token.

Starts `muser serve` (embedded model, 4 slots) as a child process on 127.0.0.1 and, per
repetition, streams (a) one chat request with n=4 and (b) four concurrent requests with n=1,
each with a fresh ~PROMPT_TOKENS-token prompt (a nonce up front, so no slot's cache is reused)
and temperature 1 with distinct seeds.  "TTFT(all)" = request start -> the last of the four
choices' first content chunk.  The n=4 request prefills once and forks three sessions from the
cut (server/choices.py); the separate requests prefill four times.

    python benchmarks/n_bench.py --repeats 5 --words 300
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from server_load import start_server            # noqa: E402
from serverproc import sse_events, stop          # noqa: E402

WORDS = ("the ring keeps the last tokens of every sliding layer so its memory stays flat while "
         "the growing plane keeps every token of the full layers ").split()


def prompt(nonce: int, words: int) -> list[dict]:
    body = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    return [{"role": "user", "content": f"[{nonce}] {body}\nSummarise this in one line."}]


async def stream(client, name, messages, n, seed, tokens) -> tuple[float, list[float], dict]:
    body = {"model": name, "messages": messages, "max_tokens": tokens, "temperature": 1.0,
            "seed": seed, "n": n, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    firsts: dict[int, float] = {}
    usage = {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for ev in sse_events(r):
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                if ch.get("delta", {}).get("content") and ch["index"] not in firsts:
                    firsts[ch["index"]] = time.perf_counter()
    return t0, [firsts[i] for i in sorted(firsts)], usage


async def run(base, name, args):
    forked, separate = [], []
    async with httpx.AsyncClient(base_url=base, timeout=600) as c:
        await stream(c, name, prompt(-1, args.words), 1, 0, 2)          # warm-up
        for rep in range(args.repeats):
            t0, firsts, use = await stream(c, name, prompt(2 * rep, args.words), 4, rep, args.tokens)
            forked.append(max(firsts) - t0)
            start = time.perf_counter()
            outs = await asyncio.gather(*(stream(c, name, prompt(2 * rep + 1, args.words), 1, rep + k,
                                                 args.tokens) for k in range(4)))
            separate.append(max(f[1][0] for f in outs) - start)
            print(f"rep {rep}: n=4 {forked[-1]:.2f} s (prompt {use.get('prompt_tokens')} tokens, "
                  f"counted once), 4 requests {separate[-1]:.2f} s", flush=True)
    return forked, separate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--words", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=8)
    args = ap.parse_args()
    proc, base, name = start_server(args)
    try:
        forked, separate = asyncio.run(run(base, name, args))
    finally:
        stop(proc, 30)
    f, s = statistics.median(forked), statistics.median(separate)
    print(f"| TTFT(all four), median of {args.repeats} | n=4, one request | 4 requests | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| {args.words}-word prompt | {f:.2f} s | {s:.2f} s | {f / s:.2f}x |")


if __name__ == "__main__":
    main()
