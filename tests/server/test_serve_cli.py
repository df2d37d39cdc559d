"""`muser serve` as a real process: flags, default bind address, auth, clean shutdown."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_process(tiny):
    from muser.testing import tiny_model_dir
    port = free_port()
    cmd = [sys.executable, "-m", "muser.cli", "serve", "--model", str(tiny_model_dir()),
           "--port", str(port), "--served-name", "tiny", "--api-key", "k1", "--slots", "2",
           "--output-reserve", "32", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline, "server did not come up"
            time.sleep(0.2)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k1", max_retries=0)
        r = c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=2, temperature=0)
        assert r.usage.completion_tokens == 2                       # greedy: no sampled early stop
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="bad",
                          max_retries=0).models.list()
        # bound to loopback only (the default --host)
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout \
            if os.path.exists("/usr/bin/ss") or os.path.exists("/bin/ss") else ""
        if listening:
            assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode in (0, -signal.SIGINT), proc.stdout.read().decode()


def test_serve_rejects_bad_flags():
    out = subprocess.run([sys.executable, "-m", "muser.cli", "serve", "--slots", "0"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "slots must be in [1, 256]" in out.stderr
