"""Replicas on Ray Serve: aggregate tok/s and TTFT with 1 vs N replicas; the cost of moving
a session between replicas (save + load + install) vs re-prefilling it.

    python benchmarks/replicas_bench.py                          # both parts, embedded model, CPU
    python benchmarks/replicas_bench.py --part load --replicas 1 2 --clients 8 --requests 24
    python benchmarks/replicas_bench.py --part move --contexts 2048 8192 32000
    # the GPU box (unattended; one GPU per replica):
    python benchmarks/replicas_bench.py --device cuda --model PATH --num-gpus 1 --replicas 1 2 \\
        --clients 32 --requests 128 --prompt-words 400 --max-tokens 128 --slots 16

Part "load": a local Ray cluster; for each N in --replicas, `muser.serve_app` with N
replicas (each --num-gpus GPUs, or on the CPU an equal share of the cores as its torch
threads) behind Ray Serve's proxy on a free loopback port; --clients concurrent clients
send --requests greedy streaming chat requests in all (distinct prompts, no shared prefix
beyond the chat template, no session id), each --max-tokens long.  Aggregate tok/s is all
completion tokens over the level's wall time; TTFT is request -> first content chunk
(median, p95).  The load generator runs in this process: on a small CPU box it competes
with the replicas for cores, and the table says how many cores there were.

Part "move": on one engine (the CPU default unless --dtype/--quant), for each context N:
re-prefill = prefill N tokens into a fresh session; move = take the slot's cut at a turn
end, write it to the shared tier (muser.server.replicas.tier, session-pack format,
durable), find it by the next prompt, load and install it into another slot -- what a
conversation costs when its replica dies.  Both then hold bitwise the same cache (checked).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from serverproc import free_port, launch, sse_events, stop   # noqa: E402

WORDS = ("ocean mountain city night library rain train moon garden desert music bridge winter "
         "river market clock island forest harbor lantern engine window letter story voice "
         "market stone field cloud signal paper thread copper silver orange").split()


def prompt(i: int, words: int) -> list[dict]:
    rng = random.Random(i)
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return [{"role": "user", "content": f"{i}: {text}. Write a long story about it."}]


# ---------------------------------------------------------------------- part "load"
async def one(client, base: str, model: str, i: int, args) -> tuple[float, int, float]:
    body = {"model": model, "messages": prompt(i, args.prompt_words), "max_tokens": args.max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for ev in sse_events(r):
            if "error" in ev:
                raise RuntimeError(ev["error"])
            if ev.get("choices") and ev["choices"][0]["delta"].get("content") and ttft is None:
                ttft = time.perf_counter() - t0
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
    return ttft or float("nan"), tokens, time.perf_counter() - t0


async def drive(base: str, model: str, args) -> dict:
    import httpx
    queue = list(range(args.requests))
    results = []
    async with httpx.AsyncClient(timeout=3600, limits=httpx.Limits(max_connections=args.clients)) as c:
        await one(c, base, model, 10_000, argparse.Namespace(**{**vars(args), "max_tokens": 2}))

        async def worker():
            while queue:
                i = queue.pop()
                results.append(await one(c, base, model, i, args))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.clients)))
        wall = time.perf_counter() - t0
    ttfts = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {"requests": len(results), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall,
            "ttft_median_s": statistics.median(ttfts),
            "ttft_p95_s": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))]}


def part_single(args) -> dict:
    """The same load on one plain `muser serve` process (no Ray): the baseline."""
    port = free_port()
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", args.model, "--device",
           args.device, "--port", str(port), "--slots", str(args.slots), "--served-name", "bench",
           "--queue-size", "1024", "--queue-timeout", "3600", "--log-level", "warning"]
    for flag, v in (("--dtype", args.dtype), ("--quant", args.quant),
                    ("--max-context", args.max_context)):
        if v is not None:
            cmd += [flag, str(v)]
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    proc = launch(cmd, base)
    try:
        r = asyncio.run(drive(base, "bench", args))
        r.update(replicas="single", threads_per_replica=os.cpu_count(), gpus_per_replica=0,
                 ready_s=time.perf_counter() - t0, slots=args.slots)
        print(json.dumps(r), flush=True)
        return r
    finally:
        stop(proc, 30)


def part_load(args) -> list[dict]:
    import ray
    from ray import serve

    from muser.server.config import ServerConfig
    from muser.server.replicas import serve_app
    from muser.server.replicas.settings import EngineOptions, RoutingConfig
    cores = os.cpu_count() or 1
    gpus = None
    if args.num_gpus:
        import torch
        gpus = torch.cuda.device_count()
    ray.init(num_cpus=max(cores, max(args.replicas) + 1), num_gpus=gpus, include_dashboard=False,
             object_store_memory=256 << 20, log_to_driver=False, configure_logging=False)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rows = []
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        for n in args.replicas:
            threads = args.threads or (max(1, cores // n) if not args.num_gpus else None)
            app = serve_app(engine=EngineOptions(args.model, device=args.device, dtype=args.dtype,
                                                 quant=args.quant, max_context=args.max_context),
                            server=ServerConfig(model_id="bench", slots=args.slots,
                                                queue_size=1024, queue_timeout=3600),
                            routing=RoutingConfig(route_timeout_s=3600), num_replicas=n,
                            num_cpus=threads or 1, num_gpus=args.num_gpus, threads=threads)
            t0 = time.perf_counter()
            serve.run(app, name="bench", route_prefix="/")
            ready = time.perf_counter() - t0
            r = asyncio.run(drive(base, "bench", args))
            r.update(replicas=n, threads_per_replica=threads, gpus_per_replica=args.num_gpus,
                     ready_s=ready, slots=args.slots)
            rows.append(r)
            print(json.dumps(r), flush=True)
            serve.delete("bench")
    finally:
        serve.shutdown()
        ray.shutdown()
    return rows


# ---------------------------------------------------------------------- part "move"
def part_move(args) -> list[dict]:
    import torch

    import muser
    from muser.server.replicas.tier import PackDirTier
    from muser.server.slots import Slot
    need = max(args.contexts) + 64
    engine = muser.load(args.model, device=args.device, dtype=args.dtype, quant=args.quant,
                        max_context=max(need, args.max_context or 0), progress=False)
    text = ("A hybrid cache keeps sliding windows in rings and full history in growing planes. "
            * (need // 8))
    ids = engine.tokenizer.encode(text)[:need]
    contexts = [n for n in args.contexts if n < min(engine.max_context, len(ids))]
    for n in sorted(set(args.contexts) - set(contexts)):
        print(f"skipping context {n}: the model's context is {engine.max_context}", flush=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    rows = []
    warm = engine.new_session()                 # first-call costs (kernel builds) out of the rows
    warm.prefill(ids[:600])
    warm.snapshot()
    del warm
    with tempfile.TemporaryDirectory(dir=args.tier_dir) as d:
        tier = PackDirTier(d, engine, block=64)
        for n in contexts:
            src = Slot(0, engine.new_session())
            sync()
            t0 = time.perf_counter()
            src.session.prefill(ids[:n])
            sync()
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            snap = src.session.snapshot()
            sync()
            t1 = time.perf_counter()
            path = tier.save("bench-session", 0, snap, 0, None)
            t2 = time.perf_counter()
            nxt = ids[:n] + [1000]
            hit = tier.find("bench-session", nxt)
            dst = Slot(1, engine.new_session())
            got = tier.load(hit, engine, dst)
            sync()
            t3 = time.perf_counter()
            assert got == n and dst.session.snapshot().equal(snap), "the moved cache differs"
            r = {"context": n, "prefill_s": prefill, "snapshot_s": t1 - t0, "save_s": t2 - t1,
                 "find_load_install_s": t3 - t2, "move_s": t3 - t0,
                 "pack_bytes": path.stat().st_size, "speedup": prefill / (t3 - t0)}
            rows.append(r)
            print(json.dumps(r), flush=True)
            del src, dst, snap
    return rows


# ---------------------------------------------------------------------- main
def table(load: list[dict], move: list[dict], args) -> str:
    out = []
    if load:
        base = load[0]["tok_s"]
        out += [f"replicas on {args.device} ({os.cpu_count()} cores, {args.model}): "
                f"{args.clients} clients, {args.requests} requests x {args.max_tokens} tokens",
                "| replicas | slots/replica | threads/replica | GPUs/replica | agg tok/s | vs first | TTFT median | TTFT p95 |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['replicas']} | {r['slots']} | {r['threads_per_replica'] or '-'} | {r['gpus_per_replica'] or '-'} "
                f"| {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | {r['ttft_median_s']:.2f} s "
                f"| {r['ttft_p95_s']:.2f} s |" for r in load]
    if move:
        out += ["", f"moving a session ({args.model}, {args.device}): save + load + install vs re-prefill",
                "| context | re-prefill | snapshot | save | find + load + install | move total | pack MB | move speedup |",
                "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['context']:,} | {r['prefill_s']:.2f} s | {r['snapshot_s'] * 1e3:.0f} ms "
                f"| {r['save_s'] * 1e3:.0f} ms | {r['find_load_install_s'] * 1e3:.0f} ms "
                f"| {r['move_s'] * 1e3:.0f} ms | {r['pack_bytes'] / 1e6:.1f} | {r['speedup']:.0f}x |"
                for r in move]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["load", "move", "both"], default="both")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--quant", default=None)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--num-gpus", type=float, default=0, help="GPUs per replica (part load)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per replica (CPU)")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--prompt-words", type=int, default=120)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 8192, 32000])
    ap.add_argument("--tier-dir", default=None, help="where the move part writes (default: tmp)")
    ap.add_argument("--single", action="store_true",
                    help="part load: also run the plain single-process server first (baseline)")
    ap.add_argument("--json", default=None, help="write all rows here")
    args = ap.parse_args()
    load = []
    if args.part in ("load", "both"):
        load = ([part_single(args)] if args.single else []) + part_load(args)
    move = part_move(args) if args.part in ("move", "both") else []
    print(table(load, move, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "load": load, "move": move}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
