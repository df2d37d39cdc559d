"""The engine process's event-loop CPU per streamed token, without a model or a GPU.

What it runs is the server's own hand-over, piece for piece: a worker thread emits one
"delta" event per stream per round through the job's `Outbox` (as the scheduler does), each
stream is a real `Formatter.stream` inside a real `SSEResponse`, and its ASGI `send` posts
to a `bridge.Link` writing frames to a socketpair whose other end a child process drains (the
`--front-process` engine side).  The worker sleeps between rounds (the GPU step, no GIL).

    python benchmarks/loop_cost.py --streams 16 --rounds 2000 --step-us 600 [--pushed]

Prints the loop thread's CPU time per token (time.thread_time, so the worker's and the
drain's time are not in it) and the rounds' wall rate.  A change to the hand-over is judged
by the first figure, measured before and after in one run (benchmarks/RESULTS.md); it is a
CPU proxy for what the loop takes from the scheduler's GIL on the GPU host.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

from muser.server import schemas
from muser.server.bridge import Link
from muser.server.job import Job
from muser.server.metrics import Metrics
from muser.server.outbox import Outbox
from muser.server.responses import Formatter
from muser.server.sse import SSEResponse

DRAIN = "import os,sys\nfd=int(sys.argv[1])\nwhile os.read(fd, 1 << 20): pass\n"
WORDS = [" the", " sea", " is", " wide", ",", " and", " grey", "."]


def make_state():
    return SimpleNamespace(model_id="m", metrics=Metrics(), base_model_note=None,
                           config=SimpleNamespace(replica=None), token_text=None)


async def one_run(args) -> tuple[float, float, int]:
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    drain = subprocess.Popen([sys.executable, "-c", DRAIN, str(theirs.fileno())],
                             pass_fds=[theirs.fileno()])
    theirs.close()
    _, writer = await asyncio.open_unix_connection(sock=ours)
    link, outbox, state = Link(writer), Outbox(loop), make_state()
    req = schemas.ChatCompletionRequest(model="m", stream=True,
                                        messages=[{"role": "user", "content": "hi"}])
    jobs, tasks = [], []
    for rid in range(args.streams):
        job = Job(None, SimpleNamespace(n=1), args.rounds, [], outbox)
        fmt = Formatter(state, req, True, time.perf_counter())

        def post(message, rid=rid):
            link.post(("send", rid, message))

        async def send(message, post=post):
            post(message)

        async def receive():
            await asyncio.Event().wait()

        scope = {"type": "http"}
        if args.pushed:                          # bridge.serve_link's scope
            scope["extensions"] = {"muser.post": post}
        resp = SSEResponse(fmt.stream(job), lambda: None, push=(job, fmt.shaper(job)))
        tasks.append(asyncio.create_task(resp(scope, receive, send)))
        jobs.append(job)
    done = threading.Event()
    wall = [0.0]

    def worker():
        t0 = time.perf_counter()
        for r in range(args.rounds):
            time.sleep(args.step_us / 1e6)
            for job in jobs:
                job.emit("delta", 0, WORDS[r % len(WORDS)], [])
        for job in jobs:
            job.emit("end", 0, "length")
            job.emit("done", ["length"], args.rounds)
        wall[0] = time.perf_counter() - t0
        done.set()

    c0 = time.thread_time()
    th = threading.Thread(target=worker)
    th.start()
    await asyncio.gather(*tasks)
    cpu = time.thread_time() - c0
    th.join()
    writer.close()
    await writer.wait_closed()
    drain.wait()
    tokens = args.rounds * args.streams
    return cpu / tokens * 1e6, tokens / wall[0], tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--step-us", type=float, default=600.0, help="the worker's sleep a round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--pushed", action="store_true",
                    help="streams pushed from the outbox (the --front-process engine side)")
    args = ap.parse_args()
    us, rates = [], []
    for _ in range(args.repeats):
        u, rate, _ = asyncio.run(one_run(args))
        us.append(u)
        rates.append(rate)
    print("| streams | rounds | step us | pushed | loop CPU us/token (median, min) | tok/s (median) |")
    print("|---:|---:|---:|---|---:|---:|")
    print(f"| {args.streams} | {args.rounds} | {args.step_us:.0f} | {'yes' if args.pushed else 'no'} | "
          f"{statistics.median(us):.2f}, {min(us):.2f} | {statistics.median(rates):,.0f} |")


if __name__ == "__main__":
    main()
