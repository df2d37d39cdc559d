"""`ignore_eos` and `min_tokens` (vLLM's extensions). ignore_eos: the model's end-of-sequence ids -- and a chat's turn
markers -- do not end the output, so a benchmark gets the length it asked for; a request's own
`stop_token_ids`, stop strings and max_tokens still end it.  The model is pushed onto its EOS
with logit_bias, so every row below is decided, not a chance of the random weights."""
from __future__ import annotations

import pytest


def _eos(srv) -> int:
    return int(srv.state.engine.spec.eos_token_ids[0])


@pytest.mark.parametrize("ignore, finish, tokens", [(False, "stop", 1), (True, "length", 6)])
def test_an_eos_ends_a_completion_unless_ignored(tiny_server, ignore, finish, tokens):
    c = tiny_server.client()
    out = c.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                               logit_bias={str(_eos(tiny_server)): 100},
                               extra_body={"ignore_eos": ignore})
    assert out.choices[0].finish_reason == finish
    assert out.usage.completion_tokens == tokens        # an EOS that ends it is counted


def test_a_chat_with_ignore_eos_runs_past_its_turn_marker(tiny_server):
    srv = tiny_server
    marker = sorted(srv.state.turn_markers)[0]
    c = srv.client()
    msgs = [{"role": "user", "content": "hi"}]
    kw = dict(model="tiny", messages=msgs, max_tokens=5, temperature=0, logit_bias={str(marker): 100})
    assert c.chat.completions.create(**kw).choices[0].finish_reason == "stop"
    out = c.chat.completions.create(**kw, extra_body={"ignore_eos": True}, stream=True)
    chunks = list(out)
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == ["length"]


def test_stop_token_ids_still_stop_an_output_that_ignores_eos(tiny_server):
    c = tiny_server.client()
    out = c.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0,
                               logit_bias={"40": 100},
                               extra_body={"ignore_eos": True, "stop_token_ids": [40]})
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == 1


def test_ignore_eos_must_be_a_boolean(tiny_server):
    r = tiny_server.http().post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                         "max_tokens": 2, "ignore_eos": "yes"})
    assert r.status_code == 400 and "ignore_eos" in r.text


@pytest.mark.parametrize("min_tokens, tokens", [(0, 1), (4, 5)])
def test_min_tokens_holds_the_eos_back_until_that_many_are_out(tiny_server, min_tokens, tokens):
    """min_tokens (vLLM's): the ids that would end the output are refused until min_tokens are
    generated; then the EOS (pushed by the bias) ends it -- counted, as every ending EOS is."""
    out = tiny_server.client().completions.create(
        model="tiny", prompt="hello", max_tokens=10, temperature=0,
        logit_bias={str(_eos(tiny_server)): 100}, extra_body={"min_tokens": min_tokens})
    assert out.choices[0].finish_reason == "stop" and out.usage.completion_tokens == tokens


def test_min_tokens_above_max_tokens_is_refused(tiny_server):
    r = tiny_server.http().post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                         "max_tokens": 2, "min_tokens": 3})
    assert r.status_code == 400 and "min_tokens" in r.text
