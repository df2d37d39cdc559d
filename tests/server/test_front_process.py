"""`muser serve --front-process`: HTTP in a process of its own, the app and engine in another
(server/front.py, server/bridge.py) -- answers, errors, disconnects and stops as the
one-process server gives them."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from server_harness import chat_burst, completions_burst, serve, serve_front

CHATS = [([{"role": "user", "content": f"tell me about {w}"}], n)
         for w, n in (("owls", 9), ("rain", 4), ("maps", 12), ("salt", 7))]
PROMPTS = ["once upon a time", "the sea is", [5, 6, 7, 8, 9], "abc"]


def stream_texts(srv, prompt: str, **kw) -> list[str]:
    """The text of each chunk of a streamed completion, in order."""
    c = srv.client()
    return [ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt=prompt, stream=True, temperature=0, **kw) if ch.choices]


def test_answers_through_the_front_equal_the_one_process_servers(tiny):
    runs = []
    for make in (serve, serve_front):
        with make(tiny, model_id="tiny", slots=4, output_reserve=32) as srv:
            chats = chat_burst(srv, CHATS)
            comps = completions_burst(srv, PROMPTS, max_tokens=6, temperature=0, logprobs=2)
            comps = [(r.choices[0].text, r.choices[0].logprobs.token_logprobs,
                      r.choices[0].logprobs.top_logprobs, r.usage.completion_tokens)
                     for r in comps]
            chunks = stream_texts(srv, "the quick brown", max_tokens=10)
            runs.append((chats, comps, chunks))
    # the front's streams are pushed from the outbox, the one process's go through a queue and
    # a task: the same chunks, boundaries included
    assert runs[0] == runs[1]
    assert len(runs[0][2]) >= 3 and all(n > 0 for _, n in runs[0][0])


def test_errors_keep_their_status_and_shape_through_the_front(tiny):
    with serve_front(tiny, model_id="tiny", slots=2, output_reserve=32, api_key="k1",
                     max_body_bytes=4096) as srv:
        h = {"authorization": "Bearer k1"}
        with srv.http() as http:
            cases = [
                (http.post("/v1/chat/completions", json={"model": "tiny", "messages": "x"},
                           headers=h), 400, "invalid_request_error"),
                (http.post("/v1/chat/completions", json={"model": "tiny", "messages": []}),
                 401, "authentication_error"),
                (http.post("/v1/completions", json={"model": "nope", "prompt": "a"}, headers=h),
                 404, "invalid_request_error"),
                (http.post("/v1/completions", content=b"{" + b" " * 8192 + b"}", headers=h),
                 413, "invalid_request_error"),
            ]
            for r, status, kind in cases:
                assert r.status_code == status, r.text
                assert r.json()["error"]["type"] == kind, r.text
            assert http.get("/metrics").status_code == 200
            assert http.get("/v1/models", headers=h).json()["data"][0]["id"] == "tiny"


def test_a_client_that_leaves_mid_stream_frees_its_slot(tiny):
    with serve_front(tiny, model_id="tiny", slots=1, output_reserve=32) as srv:
        body = {"model": "tiny", "prompt": "go", "max_tokens": 200, "temperature": 0,
                "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=srv.base, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                got = [next(lines) for _ in range(4)]
                assert any(line.startswith("data: {") for line in got)
        srv.wait_idle()                          # the engine side heard the disconnect
        assert srv.state.metrics.value("disconnects_total") >= 1
        r = srv.client().completions.create(model="tiny", prompt="next", max_tokens=3,
                                            temperature=0)
        assert r.usage.completion_tokens == 3    # the one slot serves the next client


def test_the_front_closes_a_request_head_that_never_completes(tiny):
    with serve_front(tiny, model_id="tiny", slots=1, output_reserve=32, header_timeout=1.0) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")      # never ends
            s.settimeout(30)
            assert s.recv(100) == b""            # closed by the front's head guard


def test_the_front_process_imports_no_torch():
    code = "import sys, muser.server.front; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _start_cli(tiny_dir, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", str(tiny_dir), "--port",
           str(port), "--served-name", "tiny", "--slots", "1", "--output-reserve", "32",
           "--front-process", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 120
    while True:
        assert proc.poll() is None, proc.stdout.read().decode()
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        assert time.time() < deadline, "server did not come up"
        time.sleep(0.2)


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] == "Z":
                    return True              # exited, not yet reaped
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("stop", ["sigint_to_the_engine", "engine_killed"])
def test_both_processes_stop_together(tiny, stop):
    from muser.testing import tiny_model_dir
    from test_serve_cli import free_port
    port = free_port()
    proc = _start_cli(tiny_model_dir(), port)
    fronts = _children(proc.pid)
    assert len(fronts) == 1
    try:
        if stop == "sigint_to_the_engine":
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 0, proc.stdout.read().decode()
        else:
            proc.kill()
            proc.wait(10)
        assert _gone(fronts[0], 20), f"the front outlived the engine process ({stop})"
    finally:
        for pid in [proc.pid, *fronts]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("choice, device, expected", [
    ("auto", "cuda:0", True), ("auto", "cpu", False), ("on", "cpu", True), ("off", "cuda:0", False)])
def test_the_front_process_is_on_by_default_only_for_a_cuda_engine(choice, device, expected):
    from types import SimpleNamespace

    from muser.cli.serve import front_process
    assert front_process(choice, SimpleNamespace(device=device)) is expected


def test_a_bare_flag_turns_the_front_on_and_replicas_refuse_it():
    from muser.cli.main import build_parser
    args = build_parser().parse_args(["serve", "--front-process", "--model", "x"])
    assert args.front_process == "on" and args.model == "x"
    out = subprocess.run([sys.executable, "-m", "muser.cli", "serve", "--front-process",
                          "--replicas", "2"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "do not combine" in out.stderr, out.stderr[-500:]
