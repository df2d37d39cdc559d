"""Structured outputs, logprobs, n, sampling controls and bad input, through the official openai
client against a real server on the tiny model."""
from __future__ import annotations

import asyncio
import json

import jsonschema
import openai
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from server_harness import serve

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}
RF = {"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}}
USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def srv(tiny):
    with serve(tiny, model_id="tiny", slots=4, output_reserve=32) as s:
        s.state.engine.grammars.tokenizer                    # built before the first request
        yield s


def chat(srv, **kw):
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 40)
    return srv.client().chat.completions.create(model="tiny", **kw)


def stream_chat(srv, **kw):
    """(text per choice index, finish per index, usage) of a streamed chat completion."""
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 40)
    texts, finish, usage = {}, {}, None
    for ch in srv.client().chat.completions.create(model="tiny", stream=True,
                                                   stream_options={"include_usage": True}, **kw):
        usage = ch.usage or usage
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return texts, finish, usage


# ----------------------------------------------------------------------------- structured outputs
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_validates_streamed_or_not(srv, temperature):
    r = chat(srv, response_format=RF, temperature=temperature, seed=4)
    c = r.choices[0]
    assert c.finish_reason == "stop"
    jsonschema.validate(json.loads(c.message.content), SCHEMA)
    texts, finish, _ = stream_chat(srv, response_format=RF, temperature=temperature, seed=4)
    assert texts[0] == c.message.content and finish[0] == "stop"


def test_json_object_on_both_endpoints(srv):
    r = chat(srv, response_format={"type": "json_object"}, temperature=0, max_tokens=80)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = srv.client().completions.create(model="tiny", prompt="data:", max_tokens=40, temperature=0,
                                        extra_body={"response_format": RF})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


@pytest.mark.parametrize("so,check", [
    ({"regex": "[a-c]{2,4}-[0-9]{2}"}, lambda t: __import__("re").fullmatch("[a-c]{2,4}-[0-9]{2}", t)),
    ({"choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"grammar": 'start: "say " WORD\nWORD: /[a-z]{1,5}/'},
     lambda t: __import__("re").fullmatch("say [a-z]{1,5}", t)),
    ({"grammar": 'root ::= "n=" [0-9] [0-9]?'}, lambda t: __import__("re").fullmatch("n=[0-9]{1,2}", t)),
    ({"json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
])
def test_structured_outputs_extension(srv, so, check):
    for temperature in (0.0, 1.0):
        r = srv.client().completions.create(model="tiny", prompt="x", max_tokens=24, seed=2,
                                            temperature=temperature,
                                            extra_body={"structured_outputs": so})
        if r.choices[0].finish_reason == "stop":
            assert check(r.choices[0].text), r.choices[0].text


def test_a_grammar_that_cannot_finish_ends_with_length(srv):
    schema = {"type": "string", "minLength": 60, "maxLength": 60}
    r = chat(srv, max_tokens=5, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


def test_constrained_requests_in_one_batch_equal_each_alone(srv):
    schemas = [SCHEMA, {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
               {"type": "object", "properties": {"k": {"type": "string", "maxLength": 3}},
                "required": ["k"], "additionalProperties": False}, None]

    def body(s):
        rf = None if s is None else {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
        return dict(messages=USER, max_tokens=30, temperature=0, **({"response_format": rf} if rf else {}))
    alone = [chat(srv, **body(s)).choices[0].message.content for s in schemas]

    async def burst():
        ac = srv.async_client()
        try:
            return await asyncio.gather(*(ac.chat.completions.create(model="tiny", **body(s))
                                          for s in schemas))
        finally:
            await ac.close()
    together = [r.choices[0].message.content for r in asyncio.run(burst())]
    assert together == alone
    for s, t in zip(schemas[:3], together):
        jsonschema.validate(json.loads(t), s)


# ----------------------------------------------------------------------------- logprobs
def test_chat_logprobs_are_the_samplers_and_greedy_is_the_top(srv, tiny):
    r = chat(srv, max_tokens=6, temperature=0, logprobs=True, top_logprobs=20)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for e in content:
        assert len(e.top_logprobs) == 20 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob <= 0.0
    # the first token's logprob is log_softmax of the float32 prefill logits, exactly
    ids = srv.state.tokenizer.apply_chat_template(USER)
    ref = torch.log_softmax(tiny.new_session().prefill(ids).float(), dim=-1)
    assert content[0].logprob == float(ref.max())
    assert bytes(content[0].bytes).decode("utf-8", "replace") == content[0].token or content[0].bytes


def test_logprobs_under_a_grammar_never_offer_refused_tokens(srv):
    r = chat(srv, response_format=RF, temperature=0, logprobs=True, top_logprobs=5)
    assert r.choices[0].logprobs.content[0].token == "{" or r.choices[0].logprobs.content[0].logprob == 0.0
    for e in r.choices[0].logprobs.content:
        assert all(t.logprob > float("-inf") for t in e.top_logprobs)


def test_completion_logprobs_and_echo_with_prompt_logprobs(srv, tiny):
    prompt = [2, 40, 41, 42, 43]
    r = srv.client().completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0,
                                        echo=True, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(prompt) + 3 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    rows = torch.log_softmax(tiny.new_session().extend(prompt).float(), dim=-1)
    for j in range(1, len(prompt)):
        assert abs(lp.token_logprobs[j] - float(rows[j - 1, prompt[j]])) < 1e-5
    assert r.choices[0].text.startswith(srv.state.tokenizer.decode(prompt))
    assert lp.text_offset == sorted(lp.text_offset)
    r2 = srv.client().completions.create(model="tiny", prompt=prompt, max_tokens=3, temperature=0,
                                         logprobs=0)
    # the tiny model runs the float32 path, whose matmuls are not chunk-invariant (docs/exactness.md):
    # the echo prefill (row by row) and the plain one agree to rounding, not bit for bit
    assert r2.choices[0].logprobs.token_logprobs == pytest.approx(lp.token_logprobs[len(prompt):], abs=1e-5)
    assert r2.choices[0].logprobs.tokens == lp.tokens[len(prompt):]


# ----------------------------------------------------------------------------- n > 1
def test_n_choices_prefill_once_and_reproduce_with_a_seed(srv):
    msgs = [{"role": "user", "content": "a story about n choices"}]
    r = chat(srv, messages=msgs, n=3, temperature=1.0, seed=11, max_tokens=12)
    assert [c.index for c in r.choices] == [0, 1, 2]
    one = chat(srv, messages=msgs, n=1, temperature=1.0, seed=11, max_tokens=12)
    assert one.choices[0].message.content == r.choices[0].message.content      # choice 0 == n=1
    again = chat(srv, messages=msgs, n=3, temperature=1.0, seed=11, max_tokens=12)
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    assert len({c.message.content for c in r.choices}) > 1
    assert r.usage.prompt_tokens == one.usage.prompt_tokens           # the prompt, counted once
    assert one.usage.completion_tokens <= r.usage.completion_tokens <= 3 * 12
    texts, finish, usage = stream_chat(srv, messages=msgs, n=3, temperature=1.0, seed=11, max_tokens=12)
    assert [texts[i] for i in range(3)] == [c.message.content for c in r.choices]
    assert usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == r.usage.completion_tokens


def test_n_forks_from_the_cut_without_a_second_prefill(srv):
    srv.wait_idle()
    text = srv.http().get("/metrics").text

    def prefilled(t):
        return sum(float(line.split()[-1]) for line in t.splitlines()
                   if line.startswith("muser_prefill_tokens_total"))
    start = prefilled(text)
    r = srv.client().completions.create(model="tiny", prompt=[2] + list(range(50, 90)), n=4,
                                        max_tokens=4, temperature=1.0, seed=3)
    assert len(r.choices) == 4 and r.usage.prompt_tokens == 41
    assert prefilled(srv.http().get("/metrics").text) - start == 41


def test_n_with_a_grammar_gives_valid_choices(srv):
    r = chat(srv, n=3, temperature=1.0, seed=8, response_format=RF)
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


# ----------------------------------------------------------------------------- sampling controls
def test_logit_bias_forces_and_forbids(srv):
    base = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=4, temperature=0)
    forced = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=4, temperature=0,
                                             logit_bias={"77": 100}, logprobs=0)
    assert forced.choices[0].logprobs.tokens == [srv.state.token_text.text(77)] * 4
    first = srv.state.tokenizer.encode(base.choices[0].text, add_bos=False)[0]
    banned = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=1, temperature=0,
                                             logit_bias={str(first): -100})
    assert srv.state.tokenizer.encode(banned.choices[0].text, add_bos=False)[:1] != [first]


def test_penalties_change_greedy_repetition(srv):
    kw = dict(model="tiny", prompt=[2, 40, 40, 40], max_tokens=24, temperature=0)
    plain = srv.client().completions.create(**kw).choices[0].text
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                  {"extra_body": {"repetition_penalty": 3.0}}):
        out = srv.client().completions.create(**kw, **extra).choices[0].text
        assert out != plain, extra


def test_min_p_and_stop_token_ids(srv):
    r = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=8, temperature=1.0,
                                        seed=1, extra_body={"min_p": 1.0}, logprobs=1)
    greedy = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=8, temperature=0)
    assert r.choices[0].text == greedy.choices[0].text          # min_p 1 keeps only the top token
    first = srv.state.tokenizer.encode(greedy.choices[0].text, add_bos=False)[0]
    s = srv.client().completions.create(model="tiny", prompt=[2, 40], max_tokens=8, temperature=0,
                                        extra_body={"stop_token_ids": [first]})
    assert s.choices[0].finish_reason == "stop" and s.choices[0].text == ""


def test_seed_reproduces_across_requests(srv):
    a = chat(srv, temperature=1.2, seed=99, max_tokens=16, top_p=0.9).choices[0].message.content
    b = chat(srv, temperature=1.2, seed=99, max_tokens=16, top_p=0.9).choices[0].message.content
    assert a == b


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kw,param,words", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format.json_schema.schema", "json_schema"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "if": {"type": "object"}, "then": {}}}}), "response_format.json_schema.schema", "if"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema", "required"),
    (dict(extra_body={"structured_outputs": {"grammar": "start: undefined_rule"}}),
     "structured_outputs.grammar", "grammar"),
    (dict(extra_body={"structured_outputs": {"regex": "(open"}}), "structured_outputs.regex", "regex"),
    (dict(logit_bias={"1000000": 1}), "logit_bias", "[0, 384)"),
    (dict(logprobs=True, top_logprobs=21), None, "20"),
    (dict(extra_body={"stop_token_ids": [999]}), "stop_token_ids", "384"),
    (dict(n=17), None, "16"),
])
def test_bad_structured_input_is_a_400_naming_field_and_limit(srv, kw, param, words):
    with pytest.raises(openai.BadRequestError) as e:
        chat(srv, **kw)
    body = e.value.body
    assert words in body["message"]
    if param is not None:
        assert body["param"] == param
    assert srv.http().get("/health").status_code == 200


# ----------------------------------------------------------------------------- property
LEAF = st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"enum": ["a", "b", 7]},
                        {"type": "integer", "minimum": 0, "maximum": 50},
                        {"type": "string", "maxLength": 3}])


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(props=st.dictionaries(st.sampled_from(["x", "y", "z"]), LEAF, min_size=1, max_size=3),
       seed=st.integers(0, 99), stream=st.booleans())
def test_random_schemas_through_the_server_always_validate(srv, props, seed, stream):
    schema = {"type": "object", "properties": props, "required": sorted(props),
              "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}}
    if stream:
        texts, finish, _ = stream_chat(srv, response_format=rf, temperature=1.0, seed=seed, max_tokens=48)
        text, fin = texts[0], finish[0]
    else:
        c = chat(srv, response_format=rf, temperature=1.0, seed=seed, max_tokens=48).choices[0]
        text, fin = c.message.content, c.finish_reason
    if fin == "stop":
        jsonschema.validate(json.loads(text), schema)


# ----------------------------------------------------------------------------- speculation
def test_speculating_server_gives_the_same_greedy_answers_and_valid_json(tiny):
    """Prompt-lookup blocks verified under each choice's picker: greedy text, logprob tokens and
    constrained JSON equal a plain server's; the matcher follows the kept tokens only."""
    bodies = [dict(prompt=[2] + [40, 41, 42, 43] * 6, max_tokens=24, temperature=0, logprobs=2),
              dict(prompt="data: data: data:", max_tokens=40, temperature=0,
                   extra_body={"response_format": RF}),
              dict(prompt=[2, 40, 41, 40, 41, 40], max_tokens=16, temperature=0, n=2,
                   extra_body={"structured_outputs": {"regex": "(40 41 ){1,6}"}})]

    def answers(**config):
        with serve(tiny, model_id="tiny", slots=2, output_reserve=32, **config) as s:
            out = [s.client().completions.create(model="tiny", **b) for b in bodies]
            metrics = s.http().get("/metrics").text
        return [[(c.text, c.finish_reason, c.logprobs and c.logprobs.tokens) for c in r.choices]
                for r in out], metrics
    plain, _ = answers()
    # (spec_max_batch 2: the n=2 request drafts too -- the default on an engine whose blocks
    # do not share a forward is one decoding choice)
    spec, metrics = answers(speculative="prompt-lookup", spec_block=6, spec_max_batch=2)
    assert spec == plain
    assert "muser_accepted_draft_tokens_total" in metrics
    accepted = sum(float(line.split()[-1]) for line in metrics.splitlines()
                   if line.startswith("muser_accepted_draft_tokens_total"))
    assert accepted > 0
    jsonschema.validate(json.loads(spec[1][0][0]), SCHEMA)


def test_speculation_stops_while_more_requests_decode_than_spec_max_batch(tiny):
    """--spec-max-batch 1: a round with two decoding choices takes the batched decode step;
    drafting resumes when one is left.  Greedy answers are the plain server's either way."""
    import asyncio

    body = dict(prompt=[2] + [40, 41, 42, 43] * 6, max_tokens=24, temperature=0)
    with serve(tiny, model_id="tiny", slots=2, output_reserve=32, speculative="prompt-lookup",
               spec_block=6, spec_max_batch=1) as srv:
        sched, seen = srv.state.scheduler, []
        real = sched._speculate
        sched._speculate = lambda work: (seen.append(len(work)), real(work))[1]

        async def both():
            ac = srv.async_client()
            try:
                return await asyncio.gather(*(ac.completions.create(model="tiny", n=n, **body)
                                              for n in (2, 1)))
            finally:
                await ac.close()
        together = asyncio.run(both())
        alone = srv.client().completions.create(model="tiny", **body)
    assert seen and max(seen) == 1                 # never drafted with two choices decoding
    assert all(c.text == alone.choices[0].text for r in together for c in r.choices)
    with pytest.raises(ValueError, match="spec_max_batch"):
        serve(tiny, spec_max_batch=0).__enter__()
    with serve(tiny, model_id="tiny", speculative="prompt-lookup") as srv:
        assert not tiny.shared_chunks and srv.state.scheduler.spec_max_batch == 1   # the default


def test_a_shifted_conversation_still_gets_valid_json(srv):
    msgs = []
    for i in range(14):
        msgs += [{"role": "user", "content": f"turn {i}: the quick brown fox jumps over the lazy dog"},
                 {"role": "assistant", "content": "fine, thanks. hello world"}]
    msgs.append({"role": "user", "content": "now answer in json"})
    r = chat(srv, messages=msgs, response_format=RF, temperature=0)
    assert r.model_extra["muser"]["shifted"] is True
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_stop_strings_do_not_cut_a_constrained_output(srv):
    r = chat(srv, response_format=RF, temperature=0, stop=['"', "}"])
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
