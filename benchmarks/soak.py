"""Soak: many clients for a while, a few of them hostile; memory, errors, and the greedy answer after.

Starts `muser serve` as a child process on 127.0.0.1 (a free port), records the
greedy answer to a fixed chat and a fixed completion, then runs --clients
concurrent clients for --seconds.  --hostile-clients of them loop over hostile
requests (temperature 1e-38, an endless chunked body, an upload aborted
half-way, a request head that never ends, JSON nested 100k deep, a prompt too
long by its size alone, a megabyte-long field name, absurd sampling
parameters), one every --hostile-pause seconds; the others loop over a seeded
random mix of ordinary requests (streamed and whole chats, completions,
multi-turn continuations, a client that leaves mid-stream), with a hostile one
mixed in with probability --hostile.  Every request has a timeout; the run
stops by itself.

Recorded: the server's RSS every --sample seconds (from /proc), outcomes counted
by request kind and status (or exception name), the server's own counters
(/metrics), whether /health is still 200, and whether the greedy answers are
unchanged afterwards.  Prints a markdown summary; --json FILE writes everything.

    python benchmarks/soak.py                              # embedded gemma3-270m, 32 x 60 s
    python benchmarks/soak.py --model tiny --seconds 15    # a tiny random model (smoke)
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import httpx

from serverproc import free_port, launch, stop

ASK = [{"role": "system", "content": "Answer briefly."},
       {"role": "user", "content": "Name three rivers in Europe."}]
PROMPT = "The three largest rivers in Europe are"
TOPICS = ["rivers", "clocks", "bread", "trains", "owls", "salt", "glass", "maps", "bees", "tea"]


def start_server(args) -> tuple[subprocess.Popen, str, str]:
    model, name = args.model, args.model
    if model == "tiny":
        from muser.testing import tiny_model_dir
        model, name = str(tiny_model_dir()), "tiny"
    port = free_port()
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", model, "--port", str(port),
           "--served-name", name, "--slots", str(args.slots), "--header-timeout", "3",
           "--log-level", "warning"] + (["--max-context", str(args.max_context)]
                                        if args.max_context else [])
    log = tempfile.TemporaryFile()             # read at the end for tracebacks
    base = f"http://127.0.0.1:{port}"
    proc = launch(cmd, base, timeout=300, stdout=subprocess.DEVNULL, stderr=log)
    proc.log = log
    return proc, base, name


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def greedy(base: str, name: str) -> tuple[str, str]:
    with httpx.Client(base_url=base, timeout=300) as h:
        chat = h.post("/v1/chat/completions", json={"model": name, "messages": ASK, "max_tokens": 32,
                                                    "temperature": 0}).json()
        comp = h.post("/v1/completions", json={"model": name, "prompt": PROMPT, "max_tokens": 32,
                                               "temperature": 0}).json()
    return chat["choices"][0]["message"]["content"], comp["choices"][0]["text"]


# ----------------------------------------------------------------------------- raw socket abuse
async def raw(port: int, data: bytes, read: bool = True, hold: float = 0.0) -> str:
    """Send `data`; optionally wait `hold` seconds; read the status line (or how it ended)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(data)
        await w.drain()
        if hold:
            await asyncio.sleep(hold)
        if not read:
            return "aborted"
        line = await asyncio.wait_for(r.readline(), 30)
        return line.split(b" ")[1].decode() if line.startswith(b"HTTP/") else "closed"
    except (ConnectionError, asyncio.TimeoutError) as e:
        return type(e).__name__
    finally:
        w.close()


async def endless_chunked(port: int) -> str:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    try:
        w.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"transfer-encoding: chunked\r\n\r\n")
        chunk = b"10000\r\n" + b" " * 0x10000 + b"\r\n"
        for _ in range(4096):                      # up to 256 MiB, stopped by the 413 long before
            w.write(chunk)
            await w.drain()
            try:
                line = await asyncio.wait_for(r.readline(), 0.001)
                if line:
                    return line.split(b" ")[1].decode()
            except asyncio.TimeoutError:
                pass
        return "never answered"
    except ConnectionError as e:
        return type(e).__name__
    finally:
        w.close()


# ----------------------------------------------------------------------------- the client loop
async def one(kind: str, h: httpx.AsyncClient, port: int, name: str, rng: random.Random) -> str:
    body = {"model": name, "max_tokens": rng.randint(8, 32), "temperature": 0.7}
    chat = [{"role": "user", "content": f"Tell me about {rng.choice(TOPICS)}."}]
    if kind == "chat_stream":
        async with h.stream("POST", "/v1/chat/completions",
                            json={**body, "messages": chat, "stream": True}) as r:
            async for _ in r.aiter_lines():
                pass
            return str(r.status_code)
    if kind == "chat":
        return str((await h.post("/v1/chat/completions", json={**body, "messages": chat})).status_code)
    if kind == "completion":
        return str((await h.post("/v1/completions", json={**body, "prompt": PROMPT})).status_code)
    if kind == "multi_turn":
        msgs = list(chat)
        for _ in range(3):
            r = await h.post("/v1/chat/completions", json={**body, "messages": msgs})
            if r.status_code != 200:
                return str(r.status_code)
            msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"And {rng.choice(TOPICS)}?"}]
        return "200"
    if kind == "leave_mid_stream":
        async with h.stream("POST", "/v1/chat/completions",
                            json={**body, "messages": chat, "stream": True, "max_tokens": 64}) as r:
            async for _ in r.aiter_lines():
                break
            return str(r.status_code)
    # hostile
    if kind == "tiny_temperature":
        return str((await h.post("/v1/chat/completions", json={
            **body, "messages": chat, "temperature": 1e-38})).status_code)
    if kind == "absurd_sampling":
        return str((await h.post("/v1/chat/completions", json={
            **body, "messages": chat, "top_p": 1e-300, "top_k": 1 << 20, "seed": 2 ** 64 - 1,
            "temperature": 2.0})).status_code)
    if kind == "endless_chunked":
        return await endless_chunked(port)
    if kind == "abort_upload":
        return await raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                               b"100000\r\n\r\n" + b"{" * 5000, read=False)
    if kind == "half_head":
        return await raw(port, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    if kind == "deep_json":
        return str((await h.post("/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000,
                                 headers={"content-type": "application/json"})).status_code)
    if kind == "too_long_by_size":
        return str((await h.post("/v1/chat/completions", json={
            **body, "messages": [{"role": "user", "content": "x" * 2_000_000}]})).status_code)
    if kind == "huge_field_name":
        return str((await h.post("/v1/chat/completions", json={
            **body, "messages": chat, "f" * 1_000_000: 1})).status_code)
    raise ValueError(kind)


ORDINARY = {"chat_stream": 4, "chat": 3, "completion": 2, "multi_turn": 1, "leave_mid_stream": 1}
HOSTILE = ["tiny_temperature", "absurd_sampling", "endless_chunked", "abort_upload", "half_head",
           "deep_json", "too_long_by_size", "huge_field_name"]


async def client(i: int, args, base: str, port: int, name: str, stop: float, outcomes) -> None:
    rng = random.Random(args.seed * 1000 + i)
    kinds, weights = zip(*ORDINARY.items())
    hostile_only = i < args.hostile_clients
    async with httpx.AsyncClient(base_url=base, timeout=args.timeout) as h:
        n = 0
        while time.time() < stop:
            if hostile_only:
                kind = HOSTILE[(i + n) % len(HOSTILE)]
                n += 1
                await asyncio.sleep(args.hostile_pause)
            else:
                kind = (rng.choice(HOSTILE) if rng.random() < args.hostile
                        else rng.choices(kinds, weights)[0])
            if time.time() >= stop:
                break
            try:
                result = await asyncio.wait_for(one(kind, h, port, name, rng), args.timeout + 5)
            except Exception as e:             # noqa: BLE001 -- every outcome is counted
                result = type(e).__name__
            outcomes[kind][result] += 1


async def run_load(args, proc, base: str, name: str) -> tuple[dict, list]:
    port = int(base.rsplit(":", 1)[1])
    outcomes: dict = collections.defaultdict(collections.Counter)
    samples: list = []
    t0 = time.time()
    stop = t0 + args.seconds

    async def sampler():
        while time.time() < stop + args.timeout:
            samples.append((round(time.time() - t0, 1), round(rss_mib(proc.pid), 1)))
            await asyncio.sleep(args.sample)
    watch = asyncio.ensure_future(sampler())
    await asyncio.gather(*(client(i, args, base, port, name, stop, outcomes)
                           for i in range(args.clients)))
    watch.cancel()
    samples.append((round(time.time() - t0, 1), round(rss_mib(proc.pid), 1)))
    return {k: dict(v) for k, v in outcomes.items()}, samples


def counters(base: str) -> dict:
    keep = ("muser_requests_total", "muser_disconnects_total", "muser_model_failures_total",
            "muser_request_failures_total", "muser_healthy", "muser_completion_tokens_total")
    out = {}
    for line in httpx.get(base + "/metrics", timeout=30).text.splitlines():
        if line.startswith(keep):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--hostile", type=float, default=0.05,
                    help="share of hostile requests from the ordinary clients")
    ap.add_argument("--hostile-clients", type=int, default=4, help="clients sending only hostile requests")
    ap.add_argument("--hostile-pause", type=float, default=0.5, help="seconds between their requests")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    ap.add_argument("--sample", type=float, default=2.0, help="seconds between RSS samples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    proc, base, name = start_server(args)
    try:
        before = greedy(base, name)
        rss_start = rss_mib(proc.pid)
        t0 = time.time()
        outcomes, samples = asyncio.run(run_load(args, proc, base, name))
        wall = time.time() - t0
        time.sleep(2)
        health = httpx.get(base + "/health", timeout=30).status_code
        after = greedy(base, name)
        result = {"command": " ".join(sys.argv), "clients": args.clients, "seconds": args.seconds,
                  "wall_s": round(wall, 1), "health_after": health, "greedy_unchanged":
                  after == before, "greedy_before": before, "greedy_after": after,
                  "rss_mib": {"after_warmup": round(rss_start, 1),
                              "max": max(m for _, m in samples), "end": samples[-1][1]},
                  "rss_samples": samples, "outcomes": outcomes, "server_counters": counters(base),
                  "load_average": os.getloadavg()}
    finally:
        stop(proc, 30)
    print(f"## soak: {args.clients} clients ({args.hostile_clients} hostile) x {args.seconds:g} s "
          f"({args.model}, {args.slots} slots)\n")
    print(f"- wall {result['wall_s']} s; /health after: {health}; greedy answers unchanged: "
          f"{result['greedy_unchanged']}; load average at the end {os.getloadavg()[0]:.1f}")
    r = result["rss_mib"]
    print(f"- server RSS: {r['after_warmup']} MiB after warm-up, max {r['max']} MiB, end {r['end']} MiB")
    print("\n| request kind | outcomes |\n|---|---|")
    for kind in list(ORDINARY) + HOSTILE:
        if kind in outcomes:
            print(f"| {kind} | {', '.join(f'{k}: {v}' for k, v in sorted(outcomes[kind].items()))} |")
    print("\nserver counters: " + ", ".join(f"{k} {v:g}" for k, v in result["server_counters"].items()))
    proc.log.seek(0)
    errors = [ln for ln in proc.log.read().decode(errors="replace").splitlines()
              if "Traceback" in ln or " ERROR " in ln or "Exception" in ln]
    print(f"server log: {len(errors)} traceback / error line(s)" + (f", first: {errors[0][:200]}"
                                                                   if errors else ""))
    result["server_log_errors"] = errors[:20]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if health == 200 and result["greedy_unchanged"] else 1


if __name__ == "__main__":
    sys.exit(main())
