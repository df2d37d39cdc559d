"""`muser.serve_app` on a local Ray cluster: 2 replicas of the tiny model, the official client.

One cluster for the module (Ray's start is the expensive part, ~30 s on 2 cores).
The references are one uninterrupted single-process server over the same engine
settings (CPU default: bf16 + int8): at T=0 a conversation must read the same
whichever replica serves it, before and after a replica is killed.
"""
from __future__ import annotations

import itertools
import threading
import time

import httpx
import pytest

from replica_fleet import APP, deploy, start_fleet

KEY = "fleet-key"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'muser[ray]')")
    from muser.testing import tiny_model_dir
    try:
        f = start_fleet(str(tiny_model_dir()), str(tmp_path_factory.mktemp("tier")), KEY)
    except Exception as e:                 # noqa: BLE001 -- only "Ray cannot start here" skips
        import ray
        ray.shutdown()
        pytest.skip(f"Ray could not start a local cluster here: {type(e).__name__}: {e}")
    yield f
    f.stop()


@pytest.fixture(scope="module")
def reference():
    """One uninterrupted single-process server on the engine settings the replicas use."""
    from server_harness import serve

    from muser.server.replicas.settings import EngineOptions
    from muser.testing import tiny_model_dir
    engine = EngineOptions(str(tiny_model_dir())).load()
    with serve(engine, model_id="tiny", slots=2, output_reserve=32) as srv:
        yield srv


def chat(client, messages, max_tokens, session=None, **kw):
    headers = {"x-session-id": session} if session else None
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens,
                                          temperature=0, extra_headers=headers, **kw)


def replica_of(resp) -> str:
    return resp.model_extra["muser"]["replica"]


def test_openai_api_health_and_metrics_through_two_replicas(fleet):
    names = {r["replica"] for r in fleet.replicas()}
    assert len(names) == 2
    c = fleet.client()
    r = chat(c, [{"role": "user", "content": "hello world"}], 4)
    assert r.choices[0].message.content and replica_of(r) in names
    t = c.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=3,
                             temperature=0)
    assert t.usage.completion_tokens <= 3 and t.model_extra["muser"]["replica"] in names
    assert [m.id for m in c.models.list().data] == ["tiny"]
    with fleet.http() as h:
        health = h.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "healthy"
        assert {r["replica"] for r in health.json()["replicas"]} == names
        text = h.get("/metrics").text
    for n in names:
        assert f'muser_slots_total{{replica="{n}"}} 2' in text
    assert "\nmuser_slots_total 4\n" in text                        # summed over the replicas
    assert 'muser_ingress_requests_total{route="generation"}' in text


def test_streaming_matches_the_single_server(fleet, reference):
    msgs = [{"role": "user", "content": "the lazy dog"}]
    chunks = list(chat(fleet.client(), msgs, 8, stream=True))
    assert chunks[0].model_extra["muser"]["replica"] in {r["replica"] for r in fleet.replicas()}
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == chat(reference.client(), msgs, 8).choices[0].message.content


def test_session_affinity_keeps_a_session_on_its_replica(fleet):
    c = fleet.client()
    for s in range(4):
        seen = {replica_of(chat(c, [{"role": "user", "content": f"turn {t} of {s}: {w}"}], 1,
                                session=f"affinity-{s}"))
                for t, w in enumerate(["hello", "a ring keeps", "def add(a, b)"])}
        assert len(seen) == 1, f"session affinity-{s} moved between replicas: {seen}"


def test_prefix_routing_sends_a_continuation_where_its_cache_lives(fleet):
    c = fleet.client()
    for i in range(4):
        prompt = [2] + [10 + (7 * i + j) % 300 for j in range(40)]
        first = c.completions.create(model="tiny", prompt=prompt, max_tokens=1, temperature=0)
        nxt = c.completions.create(model="tiny", prompt=prompt + [5, 6, 7], max_tokens=1,
                                   temperature=0)
        assert nxt.model_extra["muser"]["replica"] == first.model_extra["muser"]["replica"]
        assert nxt.usage.prompt_tokens_details.cached_tokens == len(prompt)


def test_bad_input_is_a_clean_4xx(fleet):
    url = "/v1/chat/completions"
    with fleet.http() as h:
        cases = [
            (h.post(url, content=b"{not json", headers=AUTH), 400),
            (h.post(url, json={"model": "tiny", "messages": "hi"}, headers=AUTH), 400),
            (h.post(url, json={"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                               "max_tokens": "3"}, headers=AUTH), 400),
            (h.post(url, json={"model": "nope", "messages": [{"role": "user", "content": "x"}]},
                    headers=AUTH), 404),
            (h.post(url, json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]}),
             401),
            (h.post(url, content=b"x" * (9 << 20), headers=AUTH), 413),
            (h.post("/v1/slots/0/save", headers=AUTH), 404),
            (h.get("/v1/nowhere", headers=AUTH), 404),
        ]
    for r, status in cases:
        assert r.status_code == status, (r.status_code, r.text[:200])
        err = r.json()["error"]
        assert err["message"] and err["type"]


def _counter(fleet, name: str) -> float:
    with fleet.http() as h:
        for line in h.get("/metrics").text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def test_a_killed_replica_loses_no_conversation_and_hangs_no_request(fleet, reference):
    c, ref = fleet.client(), reference.client()
    turn1 = [{"role": "user", "content": "hello world how are you"}]
    a1 = chat(c, turn1, 1, session="survivor")
    r1 = chat(ref, turn1, 1)
    assert a1.choices[0].message.content == r1.choices[0].message.content
    turn2 = turn1 + [{"role": "assistant", "content": a1.choices[0].message.content},
                     {"role": "user", "content": "fine, thanks"}]
    r2 = chat(ref, turn2, 12)               # the uninterrupted conversation, on one server
    victim = replica_of(a1)
    # Two long generations that share the survivor's first routing block, so prefix routing
    # sends them to the victim too; picked (on the reference) among prompts whose greedy
    # reply runs all 150 tokens, so both are provably still generating when it dies.
    candidates = ([{"role": "user", "content": f"hello world how are you? tell me a story number {n}"}]
                  for n in range(24))
    runners = list(itertools.islice(
        (m for m in candidates if chat(ref, m, 150).usage.completion_tokens == 150), 2))
    assert len(runners) == 2, "no two prompts run 150 tokens on this engine"
    long_msgs = dict(zip(("stream", "whole"), runners))
    retries_before = _counter(fleet, "muser_ingress_retries_total")

    first_chunk = threading.Event()
    out: dict = {}

    def streamer():
        try:
            for ch in chat(fleet.client(), long_msgs["stream"], 150, session="stream-s", stream=True):
                if ch.model_extra.get("muser"):
                    out["stream_replica"] = ch.model_extra["muser"]["replica"]
                if ch.choices and ch.choices[0].delta.content:
                    first_chunk.set()
            out["stream"] = "completed"
        except Exception as e:              # noqa: BLE001
            out["stream"] = e
        first_chunk.set()

    def whole():
        try:
            out["whole"] = chat(fleet.client(), long_msgs["whole"], 150, session="whole-s")
        except Exception as e:              # noqa: BLE001
            out["whole"] = e

    threads = [threading.Thread(target=whole), threading.Thread(target=streamer)]
    for t in threads:
        t.start()
    assert first_chunk.wait(30)
    deadline = time.time() + 30                       # both generations are on the victim
    while not any(r["replica"] == victim and r["busy"] == 2 for r in fleet.replicas()):
        assert time.time() < deadline, fleet.replicas()
        time.sleep(0.05)
    fleet.kill(victim)
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a request hung after its replica died"

    import openai
    assert out["stream_replica"] == victim
    err = out["stream"]                      # streamed bytes cannot be taken back: a clean error
    assert isinstance(err, openai.APIError), err
    assert "retry" in str(err)
    w = out["whole"]                         # nothing was sent yet: retried on the survivor
    assert not isinstance(w, Exception), w
    assert replica_of(w) != victim and w.usage.completion_tokens == 150
    assert _counter(fleet, "muser_ingress_retries_total") > retries_before
    assert w.choices[0].message.content == chat(ref, long_msgs["whole"], 150).choices[0].message.content

    a2 = chat(c, turn2, 12, session="survivor")
    assert replica_of(a2) != victim
    assert a2.usage.prompt_tokens_details.cached_tokens == a1.usage.prompt_tokens > 0
    assert a2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens_details.cached_tokens
    assert a2.choices[0].message.content == r2.choices[0].message.content
    with httpx.Client(base_url=fleet.base, timeout=30) as h:
        assert h.get("/health").status_code == 200     # the survivor (and Ray's replacement)


def test_replicas_that_stop_gracefully_drain_their_conversations_to_the_tier(fleet, reference,
                                                                              tmp_path):
    """With per-turn saving off (`save="drain"`), a replica that stops gracefully -- an app
    deleted or redeployed, a scale-down -- saves its live slots first: the next turn, on a fresh
    replica, starts from the conversation's cut and reads as on one uninterrupted server."""
    from ray import serve
    tier = str(tmp_path / "drain-tier")
    deploy(fleet.model_dir, tier, fleet.key, save="drain")
    c, ref = fleet.client(), reference.client()
    turn1 = [{"role": "user", "content": "tell me about rings and planes"}]
    a1 = chat(c, turn1, 1, session="drained")
    packs = lambda: sorted(p.name for p in (tmp_path / "drain-tier").rglob("*.pack"))   # noqa: E731
    assert packs() == []                              # "drain": nothing is saved per turn
    serve.delete(APP)                                 # every replica stops gracefully: it drains
    assert packs(), "the stopped replicas saved no conversation"
    deploy(fleet.model_dir, tier, fleet.key, replicas=1, save="drain")
    turn2 = turn1 + [{"role": "assistant", "content": a1.choices[0].message.content},
                     {"role": "user", "content": "and the window?"}]
    a2 = chat(c, turn2, 8, session="drained")
    r2 = chat(ref, turn2, 8)
    assert a2.usage.prompt_tokens_details.cached_tokens == a1.usage.prompt_tokens > 0
    assert a2.choices[0].message.content == r2.choices[0].message.content

