"""Chunked admission: a long prompt prefills one chunk per round, interleaved with decode steps."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from server_harness import serve
from test_server_shift import conversation


@pytest.fixture(scope="module")
def tiny8():
    from muser.testing import tiny_model
    return tiny_model(chunk_size=8)


def log_calls(srv, log):
    for slot in srv.state.pool.slots + [type("S", (), {"session": srv.state.pool.staging})]:
        s = slot.session
        for name in ("prefill", "decode"):
            real = getattr(s, name)

            def wrapped(*a, real=real, name=name, sid=id(s), **k):
                log.append((name, sid))
                time.sleep(0.01 if name == "prefill" else 0.0)
                return real(*a, **k)
            setattr(s, name, wrapped)


def test_long_prefill_interleaves_with_decode_and_stays_exact(tiny8):
    with serve(tiny8, model_id="tiny", slots=2, output_reserve=16) as srv:
        srv.state.scheduler.eos = set()
        log: list = []
        log_calls(srv, log)
        with httpx.Client(base_url=srv.base, timeout=60) as h, h.stream(
                "POST", "/v1/completions",
                json={"model": "tiny", "prompt": [2, 5, 6], "max_tokens": 120, "temperature": 0,
                      "stream": True}) as r:
            lines = r.iter_lines()
            next(lines)
            long_prompt = [2] + [10 + i % 300 for i in range(160)]
            out = {}
            t = threading.Thread(target=lambda: out.update(h2=httpx.post(
                srv.base + "/v1/completions", timeout=60,
                json={"model": "tiny", "prompt": long_prompt, "max_tokens": 1}).json()))
            t.start()
            t.join()
        resp = out["h2"]
        slot = srv.state.pool.slots[resp["muser"]["slot"]]
        long_sid = id(slot.session)
        calls = [name for name, sid in log if sid == long_sid]
        assert calls.count("prefill") == 21                 # 161 tokens in chunks of 8
        # while the long prompt was prefilling, the other slot kept decoding
        first = next(i for i, (n, s) in enumerate(log) if s == long_sid)
        last = max(i for i, (n, s) in enumerate(log) if s == long_sid)
        between = [n for n, s in log[first:last] if s != long_sid]
        assert between.count("decode") >= 10
        cold = tiny8.new_session()
        cold.prefill(long_prompt)
        assert slot.session.snapshot().equal(cold.snapshot())


def test_cancel_during_staging_rebuild_keeps_live_session(tiny8):
    with serve(tiny8, model_id="tiny", slots=1, max_context=160, output_reserve=24) as srv:
        state = srv.state
        srv.client().completions.create(model="tiny", prompt=[2, 7, 8, 9], max_tokens=2)
        before = state.pool.slots[0].session.snapshot()
        real = state.pool.staging.prefill
        seen = []

        def slow(ids, *a, **k):
            seen.append(len(ids))
            time.sleep(0.05)
            return real(ids, *a, **k)
        state.pool.staging.prefill = slow
        body = json.dumps({"model": "tiny", "messages": conversation(8), "max_tokens": 1,
                           "stream": True})
        sock = socket.create_connection(("127.0.0.1", srv.port))       # no waiting for headers
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                      f"application/json\r\ncontent-length: {len(body)}\r\n\r\n{body}").encode())
        deadline = time.time() + 20
        while len(seen) < 3:
            assert time.time() < deadline
            time.sleep(0.005)
        sock.close()                          # the client leaves mid-rebuild
        srv.wait_idle()
        assert len(seen) < 13                 # stopped before all 13 chunks of the rebuild
        assert not state.pool.staging_lock.locked() and state.pool.staging.position == 0
        assert state.pool.slots[0].session.snapshot().equal(before)
        assert state.pool.slots[0].epoch == 0
        assert srv.http().get("/health").json()["status"] == "healthy"
