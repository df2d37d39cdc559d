"""`Engine.decode_greedy`: several sessions decoded greedily together give, token for token, what
`engine.stream` gives each prompt alone at temperature 0 -- on the embedded 270M with the CPU
defaults (bf16 + int8), stop ids included -- and leave each session holding exactly what it
consumed.  Requests that cannot run are refused before anything changes.  (The CUDA pipeline's
host side: tests/backends/test_greedy_pipeline_host.py; on the GPU: tests/cuda/test_cuda_greedy.py.)"""
import pytest

from muser.errors import CacheOverflow, RequestError
from muser.testing import tiny_model

PROMPTS = ["Say hello in one word.", "List three colors.", "What is 2 + 2? Answer briefly.",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]


def test_greedy_runs_together_give_each_prompt_its_own_stream(gemma_default):
    eng = gemma_default
    ids = [eng.encode_prompt(p, chat=i < 3) for i, p in enumerate(PROMPTS)]
    budgets = [24, 3, 30, 16]
    streams = [list(eng.stream(x, max_tokens=m)) for x, m in zip(ids, budgets)]
    # a stop id that most streams reach mid-way (the 270M's turns run past these budgets): a
    # line break; a stream's tokens end before its first one
    newline = eng.tokenizer.encode("\n")[-1]
    stops = (*eng.spec.eos_token_ids, newline)
    want = [t[:t.index(newline)] if newline in t else t for t in streams]
    sessions = [eng.new_session() for _ in ids]
    for s, x in zip(sessions, ids):
        s.prefill(x[:-1])
    got = eng.decode_greedy(sessions, [x[-1] for x in ids], budgets, stop_ids=stops)
    assert got.tokens == want
    assert "stop" in got.finish and "length" in got.finish        # a stop id, a budget
    for s, x, toks, why, m in zip(sessions, ids, got.tokens, got.finish, budgets):
        assert (why == "length") == (len(toks) == m)
        consumed = toks if why == "stop" else toks[:-1]
        assert s.tokens == x + consumed
        s.check_invariants()


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=64)


def filled(engine, n):
    s = engine.new_session()
    s.prefill(list(range(3, 3 + n)))
    return s


REFUSED = [
    ("a session twice", lambda e, a, b: e.decode_greedy([a, a], [1, 2], 3), RequestError),
    ("tokens and sessions differ", lambda e, a, b: e.decode_greedy([a, b], [1], 3), RequestError),
    ("budgets and sessions differ", lambda e, a, b: e.decode_greedy([a, b], [1, 2], [3]),
     RequestError),
    ("an id past the vocabulary", lambda e, a, b: e.decode_greedy([a, b], [1, 10 ** 6], 3),
     RequestError),
    ("a negative budget", lambda e, a, b: e.decode_greedy([a, b], [1, 2], [3, -1]), RequestError),
    ("a budget past the context", lambda e, a, b: e.decode_greedy([a, b], [1, 2], [3, 60]),
     CacheOverflow),
]


@pytest.mark.parametrize("name,call,error", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_run_that_cannot_run_is_refused_before_anything_changes(tiny, name, call, error):
    a, b = filled(tiny, 5), filled(tiny, 9)
    before = [s.snapshot() for s in (a, b)]
    with pytest.raises(error):
        call(tiny, a, b)
    assert all(s.snapshot().equal(x) for s, x in zip((a, b), before))


def test_zero_budgets_run_nothing(tiny):
    a = filled(tiny, 5)
    got = tiny.decode_greedy([a], [1], 0)
    assert got.tokens == [[]] and got.finish == ["length"] and a.position == 5


def test_a_run_one_step_ahead_gives_the_plain_runs_tokens_and_next_logits():
    """run_steps over SyncSteps -- the next step launched before the last is settled, a stopped
    session taken back one step -- against decode_loop, on the bf16 + int8 CPU path: the same
    tokens, finishes and lineages, and then the same next logits bitwise (a taken-back ring,
    which wrapped, lost nothing a later query reads)."""
    import torch

    from muser.backends.greedy import Budget, SyncSteps, decode_loop, run_steps
    eng = tiny_model("gemma3", window=4, tokenizer=False, dtype="bfloat16", quant="int8")
    lengths, budgets = (2, 6, 13), [9, 3, 9]
    probe = [filled(eng, n) for n in lengths]
    plain = decode_loop(eng, probe, Budget.check(eng, probe, [5, 6, 7], budgets, ()))
    stops = (plain.tokens[0][4], plain.tokens[2][2])           # two sessions stop mid-run
    a, b = [filled(eng, n) for n in lengths], [filled(eng, n) for n in lengths]
    got = run_steps(SyncSteps(eng), a, Budget.check(eng, a, [5, 6, 7], budgets, stops))
    want = decode_loop(eng, b, Budget.check(eng, b, [5, 6, 7], budgets, stops))
    assert got == want and got.finish.count("stop") >= 1
    for x, y in zip(a, b):
        assert x.tokens == y.tokens
        x.check_invariants()
        assert torch.equal(x.decode(9), y.decode(9))
