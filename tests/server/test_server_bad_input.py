"""Malformed requests: always a 4xx in OpenAI's error shape, never a 500, server stays healthy."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from server_harness import serve

OK_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
OK_COMP = {"model": "tiny", "prompt": "hi", "max_tokens": 1}


def with_(base, **kw):
    d = dict(base)
    for k, v in kw.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


CHAT_CASES = [
    ("bad json", b'{"model": "tiny", "messages": [', 400),
    ("non-utf8", b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
    ("not an object", b"[1, 2, 3]", 400),
    ("empty body", b"", 400),
    ("no model", with_(OK_CHAT, model=...), 400),
    ("model wrong type", with_(OK_CHAT, model=5), 400),
    ("unknown model", with_(OK_CHAT, model="gpt-4"), 404),
    ("no messages", with_(OK_CHAT, messages=...), 400),
    ("empty messages", with_(OK_CHAT, messages=[]), 400),
    ("messages not a list", with_(OK_CHAT, messages="hi"), 400),
    ("unknown role", with_(OK_CHAT, messages=[{"role": "wizard", "content": "x"}]), 400),
    ("content wrong type", with_(OK_CHAT, messages=[{"role": "user", "content": 5}]), 400),
    ("missing content", with_(OK_CHAT, messages=[{"role": "user"}]), 400),
    ("image part", with_(OK_CHAT, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400),
    ("late system", with_(OK_CHAT, messages=[{"role": "user", "content": "a"},
                                             {"role": "system", "content": "b"}]), 400),
    ("max_tokens string", with_(OK_CHAT, max_tokens="5"), 400),
    ("max_tokens float", with_(OK_CHAT, max_tokens=1.5), 400),
    ("max_tokens negative", with_(OK_CHAT, max_tokens=-1), 400),
    ("max_tokens zero", with_(OK_CHAT, max_tokens=0), 400),
    ("max_tokens absurd", with_(OK_CHAT, max_tokens=10 ** 12), 400),
    ("max_tokens past context", with_(OK_CHAT, max_tokens=100_000), 400),
    ("max_completion_tokens negative", with_(OK_CHAT, max_completion_tokens=-5), 400),
    ("temperature negative", with_(OK_CHAT, temperature=-0.1), 400),
    ("temperature absurd", with_(OK_CHAT, temperature=1e9), 400),
    ("temperature string", with_(OK_CHAT, temperature="hot"), 400),
    ("top_p zero", with_(OK_CHAT, top_p=0), 400),
    ("top_p above one", with_(OK_CHAT, top_p=1.5), 400),
    ("seed huge", with_(OK_CHAT, seed=2 ** 70), 400),
    ("seed string", with_(OK_CHAT, seed="1"), 400),
    ("n over the limit", with_(OK_CHAT, n=17), 400),
    ("n=0", with_(OK_CHAT, n=0), 400),
    ("stop too many", with_(OK_CHAT, stop=["a", "b", "c", "d", "e"]), 400),
    ("stop empty", with_(OK_CHAT, stop=""), 400),
    ("stop wrong type", with_(OK_CHAT, stop=5), 400),
    ("stream string", with_(OK_CHAT, stream="yes"), 400),
    ("stream_options without stream", with_(OK_CHAT, stream_options={"include_usage": True}), 400),
    ("unknown field", with_(OK_CHAT, frobnicate=True), 400),
    ("tool without a name", with_(OK_CHAT, tools=[{"type": "function", "function": {}}]), 400),
    ("tool_choice without tools", with_(OK_CHAT, tool_choice="required"), 400),
    ("top_logprobs without logprobs", with_(OK_CHAT, top_logprobs=2), 400),
    ("top_logprobs over 20", with_(OK_CHAT, logprobs=True, top_logprobs=21), 400),
    ("penalty out of range", with_(OK_CHAT, presence_penalty=2.5), 400),
    ("logit_bias outside the vocabulary", with_(OK_CHAT, logit_bias={"100000": 1}), 400),
    ("nan", b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
]

COMP_CASES = [
    ("empty prompt", with_(OK_COMP, prompt=""), 400),
    ("prompt wrong type", with_(OK_COMP, prompt={"a": 1}), 400),
    ("token id out of vocab", with_(OK_COMP, prompt=[1, 2, 10 ** 9]), 400),
    ("negative token id", with_(OK_COMP, prompt=[-1]), 400),
    ("two prompts", with_(OK_COMP, prompt=["a", "b"]), 400),
    ("empty token list", with_(OK_COMP, prompt=[]), 400),
    ("logprobs over 20", with_(OK_COMP, logprobs=21), 400),
    ("best_of", with_(OK_COMP, best_of=3), 400),
    ("max_tokens negative", with_(OK_COMP, max_tokens=-3), 400),
]


@pytest.fixture(scope="module")
def srv(tiny):
    with serve(tiny, model_id="tiny", slots=1, output_reserve=32, max_body_bytes=1 << 16,
               session_dir=None) as s:
        yield s


def post(h, path, body):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return h.post(path, content=data, headers={"content-type": "application/json"})


def assert_openai_error(r, status=None):
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    if status is not None:
        assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "Traceback" not in err["message"]
    assert isinstance(err["type"], str)
    assert set(err) >= {"message", "type", "param", "code"}


@pytest.mark.parametrize("name,body,status", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_malformed_chat(srv, name, body, status):
    assert_openai_error(post(srv.http(), "/v1/chat/completions", body), status)


@pytest.mark.parametrize("name,body,status", COMP_CASES, ids=[c[0] for c in COMP_CASES])
def test_malformed_completion(srv, name, body, status):
    assert_openai_error(post(srv.http(), "/v1/completions", body), status)


def test_other_bad_requests(srv):
    h = srv.http()
    r = post(h, "/v1/chat/completions", b"x" * (1 << 17))
    assert_openai_error(r, 413)
    assert r.headers["connection"] == "close"     # the unread body must not become a request head
    assert_openai_error(h.get("/v1/chat/completions"), 405)
    assert_openai_error(h.get("/v1/nope"), 404)
    assert_openai_error(h.get("/v1/models/gpt-4"), 404)
    assert_openai_error(h.post("/v1/slots/0/save", json={}), 404)          # persistence is off
    assert_openai_error(h.post("/v1/slots/abc/save", json={}), 404)
    assert_openai_error(h.post("/v1/slots/99/restore", json={}), 404)
    ok = post(h, "/v1/chat/completions", OK_CHAT)
    assert ok.status_code == 200, ok.text


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                    max_leaves=12)
FIELDS = ["model", "messages", "temperature", "top_p", "seed", "stop", "n", "stream",
          "stream_options", "max_completion_tokens", "user", "tools", "logit_bias"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda v: json.dumps(v).encode()),
    st.tuples(st.sampled_from(FIELDS), JSON).map(lambda kv: with_(OK_CHAT, **{kv[0]: kv[1]})),
    st.lists(st.fixed_dictionaries({"role": JSON, "content": JSON}), max_size=3).map(
        lambda ms: with_(OK_CHAT, messages=ms)),
))
def test_fuzzed_bodies_never_500(srv, body):
    r = post(srv.http(), "/v1/chat/completions", body)
    assert r.status_code < 500, (body, r.status_code, r.text)
    if r.status_code != 200:
        assert_openai_error(r)


def test_server_stays_healthy_after_abuse(srv):
    h = srv.http()
    assert h.get("/health").json()["status"] == "healthy"
    ok = post(h, "/v1/completions", OK_COMP)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1
