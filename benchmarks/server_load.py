"""Server load: TTFT and tokens/s for 1, 4 and 16 concurrent clients, and cache reuse.

Starts `muser serve` as a child process on 127.0.0.1 (a free port), waits for
/health, then drives it with streaming chat requests over HTTP (httpx, one
connection per client) and reads back /metrics.  Prints a markdown table.

    python benchmarks/server_load.py                      # embedded gemma3-270m, 4 slots
    python benchmarks/server_load.py --model tiny --tokens 16   # a tiny random model (smoke)
    python benchmarks/server_load.py --model 270m --device cuda --slots 16 --levels 16 \
        --tokens 128 --pipeline auto     # the H200: cuda_bench's random 270M shape, rounds ahead

Per concurrency level C, C clients each send one greedy chat request of
--tokens new tokens (distinct prompts); TTFT is request -> first content chunk
(median and max over the C clients); aggregate tok/s is all completion tokens
over the level's wall time; per-stream tok/s is each client's tokens after the
first over its time after the first.  The multi-turn row sends turn 1, then
turn 2 (turn 1 + reply + a new user message) and reports cached_tokens and
both TTFTs.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

import httpx

from serverproc import free_port, launch, sse_events, stop

TOPICS = ["the ocean", "mountains", "a city at night", "old libraries", "rain", "trains",
          "the moon", "gardens", "deserts", "music", "bridges", "winter", "rivers", "markets",
          "clocks", "islands"]


def start_server(args) -> tuple[subprocess.Popen, str, str]:
    model, name = args.model, args.model
    if model == "tiny":
        from muser.testing import tiny_model_dir
        model, name = str(tiny_model_dir()), "tiny"
    elif model in ("270m", "1b"):           # a random-weight shape (GPU), with Gemma 3's tokenizer
        model = random_model_dir(model, args.tokenizer_archive, args.max_context or 8192)
    port = free_port()
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", model, "--port", str(port),
           "--slots", str(args.slots), "--served-name", name, "--log-level", "warning",
           "--queue-size", "64", "--queue-timeout", "600"]
    if args.max_context:
        cmd += ["--max-context", str(args.max_context)]
    cmd += ["--device", args.device, "--pipeline", args.pipeline,
            "--stream-interval", str(args.stream_interval)]
    if args.front_process:
        cmd.append("--front-process")
    base = f"http://127.0.0.1:{port}"
    return launch(cmd, base), base, name


def start_spy(pid: int, path: str, flags: tuple[str, ...] = ()) -> subprocess.Popen:
    """py-spy recording `pid` (every thread, raw stacks) until stopped with SIGINT; `flags`
    adds py-spy's own (`--idle`: waiting threads too, `--gil`: only the GIL's holder,
    `--native`: C frames too -- which py-spy takes only by pausing the process, so without
    `--nonblocking` and slower)."""
    import shutil
    exe = shutil.which("py-spy") or next(
        (os.path.join(d, "bin", "py-spy") for d in sys.path
         if d and os.path.exists(os.path.join(d, "bin", "py-spy"))), "py-spy")
    pause = [] if "--native" in flags else ["--nonblocking"]
    return subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "500", "--threads",
                             *pause, "--format", "raw", "-o", path, *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spy_summary(path: str, top: int = 14) -> str:
    """Per thread: its samples, and the frames it was in most (self time and inclusive)."""
    from collections import Counter
    threads, own, incl = Counter(), Counter(), Counter()
    if not os.path.exists(path):
        return f"py-spy wrote no {path}"
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        t, n = frames[0].split(": ")[-1], int(n)
        names = [f.split(" (")[0] + " " + f.rsplit("/", 1)[-1].rstrip(")") for f in frames[1:]]
        threads[t] += n
        if names:
            own[(t, names[-1])] += n
        for f in set(names):
            incl[(t, f)] += n
    out = ["", "py-spy: samples per thread " + ", ".join(f"{t} {n}" for t, n in threads.most_common(6))]
    for title, c in (("self", own), ("inclusive", incl)):
        out.append(f"top {title}:")
        out += [f"  {n:6d}  {t}: {f}" for (t, f), n in c.most_common(top)]
    return "\n".join(out)


def write_tokenizer_archive(out: str) -> None:
    """The archive `random_model_dir` reads, from the embedded Gemma 3 270M GGUF (here, before a
    device call: the GGUF is not on the device)."""
    import tarfile
    import tempfile

    from muser.engine.loader import _embedded_gemma3_270m
    from muser.model.tokenizer import load_tokenizer
    tok = load_tokenizer(_embedded_gemma3_270m())
    with tempfile.TemporaryDirectory() as d:
        tok.hf.save_pretrained(d)
        with tarfile.open(out, "w:xz") as tar:
            for f in sorted(os.listdir(d)):
                tar.add(os.path.join(d, f), arcname=f)


def random_model_dir(shape: str, archive: str, max_context: int) -> str:
    """cuda_bench's random-weight shape saved as safetensors, with the tokenizer files of
    `archive` (a tar.xz of Gemma 3's tokenizer.json, tokenizer_config.json and chat template:
    the embedded GGUF's, `Tokenizer.hf.save_pretrained`) beside it, so that the server can
    take chats; the ids decode to text, the text is noise."""
    import tarfile

    from cuda_bench import SHAPES
    from cuda_measure import build
    model, path = build(SHAPES[shape], max_context)
    del model
    with tarfile.open(archive) as tar:
        tar.extractall(path, filter="data")
    return path


async def one_chat(client: httpx.AsyncClient, name: str, messages, tokens: int,
                   extra: dict | None = None) -> dict:
    body = {"model": name, "messages": messages, "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    t0 = time.perf_counter()
    first = None
    text, usage = "", None
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for ev in sse_events(r):
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content")
                if piece:
                    if first is None:
                        first = time.perf_counter()
                    text += piece
    end = time.perf_counter()
    first = first or end
    n = usage["completion_tokens"] if usage else 0
    return {"ttft": first - t0, "total": end - t0, "tokens": n, "text": text,
            "cached": usage["prompt_tokens_details"]["cached_tokens"] if usage else 0,
            "per_stream": (n - 1) / (end - first) if n > 1 and end > first else float("nan")}


async def level(base: str, name: str, clients: int, tokens: int, extra: dict | None = None) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=3600,
                                 limits=httpx.Limits(max_connections=clients + 2)) as client:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one_chat(
            client, name, [{"role": "user", "content": f"Write a short poem about {TOPICS[i % 16]}."}],
            tokens, extra) for i in range(clients)))
        wall = time.perf_counter() - t0
    ttfts = [r["ttft"] for r in res]
    total = sum(r["tokens"] for r in res)
    return {"clients": clients, "ttft_median": statistics.median(ttfts), "ttft_max": max(ttfts),
            "agg_tps": total / wall, "stream_tps": statistics.median(r["per_stream"] for r in res),
            "tokens": total, "wall": wall}


async def multi_turn(base: str, name: str, tokens: int) -> dict:
    async with httpx.AsyncClient(base_url=base, timeout=3600) as client:
        msgs = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "Name three rivers in Europe and one fact about each."}]
        t1 = await one_chat(client, name, msgs, tokens)
        msgs += [{"role": "assistant", "content": t1["text"]},
                 {"role": "user", "content": "Which of them is the longest?"}]
        t2 = await one_chat(client, name, msgs, tokens)
    return {"turn1_ttft": t1["ttft"], "turn1_cached": t1["cached"],
            "turn2_ttft": t2["ttft"], "turn2_cached": t2["cached"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokenizer-archive", default=".peers/gemma3-tokenizer.tar.xz",
                    help="with --model 270m / 1b: Gemma 3's tokenizer files (tar.xz)")
    ap.add_argument("--pipeline", default="off", choices=["auto", "on", "off"],
                    help="the server's greedy rounds one step ahead (server/pipeline.py)")
    ap.add_argument("--spy", metavar="PATH",
                    help="record the server with py-spy over the levels (raw stacks to PATH) and "
                         "print each thread's top frames")
    ap.add_argument("--ignore-eos", action="store_true",
                    help="ask for ignore_eos: every request runs to --tokens (a server from "
                         "before the option refuses it)")
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="the server's --stream-interval (tokens a chunk after the first)")
    ap.add_argument("--front-process", action="store_true",
                    help="the server's --front-process (HTTP in a process of its own)")
    ap.add_argument("--spy-flags", default="", metavar="FLAGS",
                    help="py-spy's own flags for --spy, e.g. '--idle' or '--gil'")
    ap.add_argument("--write-tokenizer-archive", metavar="PATH",
                    help="write --tokenizer-archive's file from the embedded GGUF, and exit")
    args = ap.parse_args()
    if args.write_tokenizer_archive:
        write_tokenizer_archive(args.write_tokenizer_archive)
        return 0
    proc, base, name = start_server(args)
    try:
        asyncio.run(level(base, name, 1, 4))                     # warm-up
        spy = start_spy(proc.pid, args.spy, tuple(args.spy_flags.split())) if args.spy else None
        extra = {"ignore_eos": True} if args.ignore_eos else None
        rows = [asyncio.run(level(base, name, int(c), args.tokens, extra))
                for c in args.levels.split(",")]
        if spy is not None:
            stop(spy, 30)
        mt = asyncio.run(multi_turn(base, name, args.tokens))
        metrics = httpx.get(base + "/metrics").text
    finally:
        stop(proc, 30)
    print(f"model {name} on {args.device}, {args.slots} slots, {args.tokens} new tokens per "
          f"request, greedy, pipeline {args.pipeline}, {os.cpu_count()} CPUs\n")
    print("| clients | TTFT median (s) | TTFT max (s) | aggregate tok/s | per-stream tok/s | wall (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['clients']} | {r['ttft_median']:.2f} | {r['ttft_max']:.2f} | {r['agg_tps']:.1f} "
              f"| {r['stream_tps']:.1f} | {r['wall']:.1f} |")
    print(f"\nmulti-turn: turn 1 TTFT {mt['turn1_ttft']:.2f} s (cached_tokens {mt['turn1_cached']}), "
          f"turn 2 TTFT {mt['turn2_ttft']:.2f} s (cached_tokens {mt['turn2_cached']})")
    keep = ("muser_cache_hits_total", "muser_cached_tokens_total", "muser_prefill_tokens_total",
            "muser_prompt_tokens_total", "muser_decode_seconds", "muser_prefill_seconds",
            "muser_graph_", "muser_steps_")
    print("\n" + "\n".join(l for l in metrics.splitlines() if l.startswith(keep)))
    if args.spy:
        print(spy_summary(args.spy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
