"""Constrained decoding, logit controls and the token picker on the tiny model (engine level)."""
from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from muser.engine.constrained import Grammar
from muser.engine.logits_processors import Controls, History, apply_controls
from muser.engine.picker import TokenPicker
from muser.engine.sampling import SamplingParams
from muser.errors import ParameterError

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def eng():
    from muser.testing import tiny_model
    return tiny_model()


def text(eng, ids):
    return eng.tokenizer.decode(ids)


@pytest.mark.parametrize("kind,source,param", [
    ("json_schema", json.dumps({"type": "frobnicate"}), "response_format.json_schema.schema"),
    ("json_schema", json.dumps({"type": "object", "if": {"type": "object"}, "then": {}}), "rf"),
    ("lark", "start: foo", "structured_outputs.grammar"),
    ("regex", "(unclosed", "structured_outputs.regex"),
    ("choice", "[]", "structured_outputs.choice"),
])
def test_bad_grammars_are_refused_naming_the_field(eng, kind, source, param):
    with pytest.raises(ParameterError) as e:
        eng.grammars.constraint(Grammar(kind, source, param))
    assert e.value.param == param and str(e.value).startswith(param)


@pytest.mark.parametrize("speculative", [None, "prompt-lookup"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_schema_output_is_valid_and_speculation_changes_nothing_at_t0(eng, speculative, temperature):
    g = Grammar.json_schema(SCHEMA)
    ids = list(eng.stream("hello", max_tokens=40, temperature=temperature, seed=5, grammar=g,
                          speculative=speculative))
    jsonschema.validate(json.loads(text(eng, ids)), SCHEMA)
    if temperature == 0.0 and speculative:
        assert ids == list(eng.stream("hello", max_tokens=40, temperature=0.0, grammar=g))


def test_matcher_rolls_back_exactly(eng):
    c = eng.grammars.constraint(Grammar.json_schema(SCHEMA))
    first = c.allowed().clone()
    toks = eng.tokenizer.encode('{"a": 12', add_bos=False)
    assert c.valid_prefix(toks) == len(toks)
    for t in toks:
        c.accept(t)
    c.rollback(len(toks))
    assert torch.equal(c.allowed(), first) and c.consumed == 0
    assert c.valid_prefix(eng.tokenizer.encode('{"zz"', add_bos=False)) == 2     # '{', '"', then no key 'z..'


def test_speculative_verify_keeps_only_grammar_valid_drafts_and_rolls_back(eng):
    s = eng.new_session()
    logits = s.prefill(eng.tokenizer.encode("hi"))
    p = TokenPicker(SamplingParams(0.0), constraint=eng.grammars.constraint(Grammar.json_schema(SCHEMA)))
    t = p.pick(logits).token                               # '{' or '{"' -- forced
    drafts = eng.tokenizer.encode('"a": 7, "b": "q"}', add_bos=False)
    usable = p.usable_drafts(drafts, sampled_drafts=False)
    assert 0 < len(usable) < len(drafts)                   # cut before "q"
    consumed = p.constraint.consumed
    rows = s.extend([t] + usable)
    picks = p.verify(rows, usable)
    assert p.constraint.consumed == consumed + len(picks)  # matcher == kept tokens
    assert len(p.history.order) == consumed + len(picks)


def test_logprobs_are_log_softmax_of_what_the_sampler_saw_and_greedy_is_first(eng):
    s = eng.new_session()
    logits = s.prefill(eng.tokenizer.encode("the quick"))
    pick = TokenPicker(SamplingParams(0.0), logprobs=5).pick(logits)
    ref = torch.log_softmax(logits.float(), dim=-1)
    assert pick.token == int(torch.argmax(logits))
    assert pick.top[0][0] == pick.token and pick.logprob == pick.top[0][1] == float(ref[pick.token])
    assert [lp for _, lp in pick.top] == sorted((lp for _, lp in pick.top), reverse=True)


def test_controls_follow_the_documented_formulas():
    s = torch.tensor([2.0, -1.0, 0.5, 3.0])
    h = History(prompt=frozenset({1}))
    h.add(0), h.add(0), h.add(2)
    c = Controls(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=2.0,
                 logit_bias=((3, -10.0),))
    out = apply_controls(s.clone(), c, h)
    # repetition on seen {0, 1, 2}: 2/2, -1*2, 0.5/2; then freq/presence on {0: 2, 2: 1}; then bias
    assert out.tolist() == [1.0 - 1.0 - 0.25, -2.0, 0.25 - 0.5 - 0.25, 3.0 - 10.0]
    h.undo(1)
    assert h.counts == {0: 2}


@pytest.mark.parametrize("generated, refused", [(0, True), (2, True), (3, False), (5, False)])
def test_min_tokens_refuses_the_ending_ids_until_that_many_are_generated(generated, refused):
    """min_tokens 3 with ids (1, 3): -inf on both while fewer than 3 tokens are generated -- a
    +100 bias does not bring them back -- then the scores as they were."""
    h = History()
    for _ in range(generated):
        h.add(2)
    c = Controls(logit_bias=((3, 100.0),), min_tokens=3, min_tokens_ids=(1, 3))
    out = apply_controls(torch.tensor([0.5, 2.0, 1.0, 0.0]), c, h).tolist()
    inf = float("-inf")
    assert out == ([0.5, inf, 1.0, inf] if refused else [0.5, 2.0, 1.0, 100.0])
    assert c.active


def test_min_tokens_without_ids_changes_nothing_and_a_negative_one_is_refused():
    assert not Controls(min_tokens=4).active
    with pytest.raises(ParameterError, match="min_tokens"):
        Controls(min_tokens=-1)


@pytest.mark.parametrize("raw,msg", [({"abc": 1}, "token ids"), ({"384": 1}, "outside the vocabulary"),
                                     ({"3": 101}, "[-100, 100]")])
def test_logit_bias_is_checked_against_the_vocabulary(raw, msg):
    with pytest.raises(ParameterError, match="logit_bias") as e:
        Controls(logit_bias=Controls.bias_from(raw, 384))
    assert msg in str(e.value)


def test_logit_bias_and_stop_at_length(eng):
    target = eng.tokenizer.encode(" the", add_bos=False)[0]
    bias = Controls(logit_bias=((target, 100.0),))
    ids = list(eng.stream("x", max_tokens=6, temperature=0.0, controls=bias))
    assert ids == [target] * 6
    # a grammar that cannot finish in time simply runs out of tokens
    long = Grammar.json_schema({"type": "string", "minLength": 40, "maxLength": 40})
    assert len(list(eng.stream("x", max_tokens=5, temperature=0.0, grammar=long))) == 5


# ----------------------------------------------------------------------------- random schemas
LEAF = st.sampled_from([
    {"type": "boolean"}, {"type": "null"}, {"enum": ["red", "green", 3]},
    {"type": "integer", "minimum": -5, "maximum": 300},
    {"type": "string", "maxLength": 4}, {"type": "string", "pattern": "^[a-c]{1,3}$"},
    {"type": "number", "minimum": 0, "maximum": 10},
])
NAMES = st.sampled_from(["id", "name", "ok", "tags", "n"])


def _obj(children):
    return st.dictionaries(NAMES, children, min_size=1, max_size=3).flatmap(
        lambda props: st.sets(st.sampled_from(sorted(props))).map(lambda req: {
            "type": "object", "properties": props, "required": sorted(req),
            "additionalProperties": False}))


SCHEMAS = st.recursive(LEAF, lambda c: _obj(c) | c.map(
    lambda it: {"type": "array", "items": it, "maxItems": 2}), max_leaves=4)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=SCHEMAS, seed=st.integers(0, 1000), speculative=st.booleans())
def test_constrained_outputs_always_parse_and_validate(eng, schema, seed, speculative):
    ids = list(eng.stream("data:", max_tokens=48, temperature=1.0, seed=seed,
                          grammar=Grammar.json_schema(schema),
                          speculative="prompt-lookup" if speculative else None))
    if len(ids) < 48:                                      # finished: complete and valid
        jsonschema.validate(json.loads(text(eng, ids)), schema)
