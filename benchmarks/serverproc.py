"""A server process for the benchmarks: a free port, start and wait until healthy, stop.

Owns: `free_port`, `launch` (Popen + poll the health path until 200, the process's exit or a
deadline; on failure the log's tail is in the error), `stop` (SIGINT, then kill) and
`sse_events` (a streamed response's JSON events).  Does not
own: the command line (each benchmark builds its own: muser or llama.cpp, its flags), or any
measurement.  Used by server_load.py, soak.py, interleave.py, prefix_bench.py, replicas_bench.py,
n_bench.py.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list[str], base: str, *, health: str = "/health", timeout: float = 600,
           env: dict | None = None, stdout=None, stderr=None, log_path: str | None = None) -> subprocess.Popen:
    """Start `cmd` and return once GET base + health answers 200.  stdout/stderr as Popen's
    (never a pipe nobody reads: it could fill and block the server); `log_path`: where they go,
    quoted in the error when the server exits or does not come up."""
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}: {_tail(stderr, log_path)}")
        try:
            if httpx.get(base + health, timeout=2).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if time.time() > deadline:
            stop(proc)
            raise SystemExit(f"server did not come up in {timeout:.0f} s: {_tail(stderr, log_path)}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen, grace: float = 60) -> None:
    """SIGINT (a graceful drain), then kill after `grace` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(stream, log_path: str | None) -> str:
    if log_path:
        return f"see {log_path}"
    if stream is not None and hasattr(stream, "seek"):
        stream.flush()
        stream.seek(0)
        return stream.read().decode(errors="replace")[-2000:]
    return "its output went to this terminal"


async def sse_events(response):
    """The JSON events of a streamed OpenAI response (`data: {...}` lines; `[DONE]` ends it)."""
    async for line in response.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])
