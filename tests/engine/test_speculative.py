"""Speculative decoding: every round leaves the caches exactly as if only the accepted tokens
had been consumed; greedy output equals plain greedy; sampling keeps the target's distribution."""
import pytest
import torch

from muser.engine.sampling import SamplingParams, probs
import muser
from muser.engine.speculative import _accept, make_drafter
from muser.testing import tiny_model, tiny_model_dir

WINDOW = 4


@pytest.fixture(scope="module")
def target():
    return tiny_model("gemma3", window=WINDOW, tokenizer=False)


@pytest.fixture(scope="module")
def draft_spec():
    return "draft:" + str(tiny_model_dir("gemma3", window=WINDOW, tokenizer=False, seed=1))


@pytest.fixture(scope="module")
def drafter(target, draft_spec):
    """Loaded once, reused by every generation it is passed to."""
    return make_drafter(draft_spec, target)


def repetitive(n=40):
    return ([5, 9, 13, 7, 21, 30, 8] * 10)[:n]


def replay(engine, prompt, kept_blocks):
    """A session that consumed only the accepted tokens, each round's tokens fed the same way."""
    s = engine.new_session()
    s.prefill(prompt)
    for block in kept_blocks:
        s.extend(block)
    return s


@pytest.mark.parametrize("block", [2, 3, 5, 8, 16])
@pytest.mark.parametrize("kind", ["prompt-lookup", "draft"])
def test_every_round_leaves_target_and_draft_as_if_only_accepted_tokens_were_consumed(target, block, kind,
                                                                                     request):
    prompt = repetitive(23)
    spec = "prompt-lookup" if kind == "prompt-lookup" else request.getfixturevalue("drafter")
    s = target.new_session()
    stats = {}
    out = list(target.stream(prompt, max_tokens=25, session=s, speculative=spec, block=block, stats=stats))
    plain = list(target.stream(prompt, max_tokens=25))
    assert out == plain
    assert stats["rounds"] > 0
    # Blocks of more than WINDOW tokens cross the ring's wrap and are wider than the window.
    ref = replay(target, prompt, stats["kept_blocks"])
    assert s.snapshot().equal(ref.snapshot())
    nxt = [3, 4, 5]
    assert torch.equal(s.extend(nxt), ref.extend(nxt))
    # A ring plane never retained more than the block's rows.
    assert stats["max_retained_rows"] <= block


def test_draft_session_cache_equals_replay_of_its_surviving_calls(target, draft_spec):
    drafter = make_drafter(draft_spec, target)
    params = SamplingParams()
    context = repetitive(11)
    for round_ in range(6):
        drafts, _ = drafter.draft(context, 5, params)
        accepted = drafts[:round_ % 4]                 # pretend the target kept a prefix
        context = context + accepted + [17 + round_]
        drafter.sync(context[:-1])
        ref = drafter.engine.new_session()
        for kind, arg in drafter.trace:
            ref.prefill(arg) if kind == "prefill" else ref.decode(arg)
        assert drafter.session.snapshot().equal(ref.snapshot())


def test_a_draft_model_is_loaded_once_by_the_caller_and_reused(target, draft_spec, drafter):
    prompt = repetitive(23)
    with pytest.raises(muser.RequestError, match="load the draft model once"):
        list(target.stream(prompt, max_tokens=4, speculative=draft_spec))
    first = list(target.stream(prompt, max_tokens=12, speculative=drafter, block=4))
    again = list(target.stream(prompt[:15], max_tokens=12, speculative=drafter, block=4))
    assert first == list(target.stream(prompt, max_tokens=12))
    assert again == list(target.stream(prompt[:15], max_tokens=12))


@pytest.mark.parametrize("point_mass", [True, False])
def test_speculative_sampling_preserves_the_target_distribution(point_mass):
    """First speculative token: draft from q (or a fixed prompt-lookup guess), accept/resample;
    the empirical distribution must match the target's p (total variation < 0.02)."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 8, 30000
    target_logits = torch.randn(2, vocab, generator=g) * 1.5
    draft_logits = torch.randn(vocab, generator=g)
    params = SamplingParams(temperature=0.8, seed=0)
    p = probs(target_logits[0], params)
    q = probs(draft_logits, params)
    counts = torch.zeros(vocab)
    for _ in range(n):
        if point_mass:
            d, qs = 3, None
        else:
            d = int(torch.multinomial(q, 1, generator=g))
            qs = [q]
        accepted, nxt = _accept(target_logits, [d], qs, params, g)
        counts[d if accepted else nxt] += 1
    tv = 0.5 * float((counts / n - p).abs().sum())
    assert tv < 0.02, f"total variation {tv:.4f}"


_DRAFTERS: dict = {}      # spec -> drafter over the embedded model, loaded once per test session


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [
    "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears, plums.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\ndef fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
])
@pytest.mark.parametrize("spec", ["prompt-lookup", "draft:gemma3-270m"])
def test_greedy_speculative_equals_plain_greedy_on_the_embedded_model(embedded, prompt, spec):
    plain = list(embedded.stream(prompt, max_tokens=24))
    stats = {}
    drafter = _DRAFTERS.get(spec) or _DRAFTERS.setdefault(spec, make_drafter(spec, embedded))
    fast = list(embedded.stream(prompt, max_tokens=24, speculative=drafter, block=6, stats=stats))
    assert fast == plain
    assert stats["rounds"] > 0


@pytest.mark.parametrize("cost, settled, drafts", [
    (1.0, [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [True] * 11),       # as cheap as a step: always
    (3.0, [2, 1], [True, True, True]),                          # history 8 -> 5 -> 3: drafts
    (3.0, [2, 1, 1], [True, True, True] + [False] * 7 + [True]),   # 2 < 3: idle, the 8th probes
    (3.0, [1, 1, 1, 8, 8], [True] * 2 + [False] * 7 + [True] + [False] * 7 + [True] * 3),
])
def test_the_draft_gate_drafts_while_rounds_pay_and_probes_otherwise(cost, settled, drafts):
    from muser.engine.speculative import DraftGate
    gate, got, todo = DraftGate(cost, 8), [], list(settled)
    while len(got) < len(drafts):
        w = gate.wants()
        got.append(w)
        if w and todo:
            gate.record(todo.pop(0))
    assert got == drafts


def test_where_blocks_cost_more_than_they_settle_speculation_takes_plain_steps(target, monkeypatch):
    """A backend whose blocks cost 100 decode steps: rounds stop drafting after the first
    few and probe every 8th; the output is plain greedy's all the same."""
    from muser.engine.speculative import PromptLookupDrafter

    class Always(PromptLookupDrafter):
        """Drafts every round (token 1, k times): mostly rejected."""
        def draft(self, context, k, params):
            return [1] * k, None

    prompt = repetitive(23)
    plain = list(target.stream(prompt, max_tokens=40))
    monkeypatch.setattr(target.backend, "verify_cost", 100.0)
    stats = {}
    out = list(target.stream(prompt, max_tokens=40, speculative=Always(), stats=stats))
    assert out == plain
    assert stats["idle_rounds"] > stats["rounds"] / 2          # most rounds did not draft
    assert stats["drafted"] > 0                                 # the first rounds and the probes did
