"""The start-up warm-up (engine/warmup.py): every decode batch size's first step before the
first request, the sessions left empty and every later bit unchanged.  On the CPU there is no
runner (a no-op); the graph runner's host side (eager, `capture=False`, as
tests/backends/test_graph_runner_host.py builds it) stands in for CUDA's, with the plain-torch
step, so the batch sizes and both kinds of steps (plain and greedy one ahead) are exercised."""
import pytest
import torch

from test_graph_runner_host import PlainStep

from muser.backends.cuda.graph import GraphRunner
from muser.backends.cuda.greedy import GreedySteps
from muser.engine.warmup import PROMPTS, warm_up
from muser.errors import RequestError
from muser.testing import tiny_model


@pytest.fixture
def engine():
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=1024)


def host_runner(engine, monkeypatch):
    r = GraphRunner(engine, capture=False)
    r.step = PlainStep(r)
    monkeypatch.setattr(engine, "decode_runner", lambda: r)
    monkeypatch.setattr(engine, "runner_stats", lambda: dict(r.stats))
    # decode_batch through the runner, as the CUDA backend's forward sends a decode step
    monkeypatch.setattr(engine, "decode_batch", lambda ss, toks: r.decode(list(ss), list(toks)))
    return r


def test_warm_up_is_a_no_op_without_a_runner(engine):
    sessions = [engine.new_session() for _ in range(3)]
    assert warm_up(engine, sessions) == {}
    assert all(s.position == 0 and s.tokens == [] for s in sessions)


def test_warm_up_refuses_a_session_in_use_and_changes_nothing(engine):
    sessions = [engine.new_session() for _ in range(2)]
    sessions[1].prefill([5, 6, 7], logits=False)
    with pytest.raises(RequestError, match="expected empty sessions; found one at position 3"):
        warm_up(engine, sessions)
    assert sessions[1].tokens == [5, 6, 7] and sessions[0].position == 0


@pytest.mark.parametrize("greedy", [False, True], ids=["decode_batch", "greedy_steps"])
def test_warm_up_steps_every_batch_size_and_leaves_the_sessions_empty(engine, monkeypatch, greedy):
    r = host_runner(engine, monkeypatch)
    sessions = [engine.new_session() for _ in range(5)]
    steps = GreedySteps(r) if greedy else None
    out = warm_up(engine, sessions, steps)
    assert out["batches"] == 5 and out["seconds"] >= 0
    # one step a batch size (two for the greedy pair: a host id, then the picks on the device)
    assert r.stats["replays"] + r.stats["eager"] == (2 if greedy else 1) * 5
    assert sorted(r.entries) == [1, 2, 3, 4, 5]
    for s in sessions:
        assert s.position == 0 and s.tokens == []
        s.check_invariants()


def test_a_warmed_session_computes_what_a_fresh_one_does(engine, monkeypatch):
    """The warm-up leaves nothing behind: a slot session used after it gives, bitwise, the
    logits of a session that never saw it (the CPU path: prefill then decode steps)."""
    warmed = [engine.new_session() for _ in range(len(PROMPTS) + 1)]
    r = host_runner(engine, monkeypatch)
    warm_up(engine, warmed, GreedySteps(r))
    monkeypatch.undo()                        # back to the CPU backend's own steps
    fresh = engine.new_session()
    prompt = [3, 9, 4, 1, 7, 2]
    for s in (warmed[-1], fresh):
        s.prefill(prompt, logits=False)
    for t in (11, 12, 13, 14, 15):            # through the ring wrap (window 4)
        assert torch.equal(warmed[-1].decode(t), fresh.decode(t))


def test_warm_up_fits_its_prompts_into_a_short_context(monkeypatch):
    """A model served with a short --max-context: the prompts are cut to fit, nothing raises."""
    small = tiny_model("gemma3", window=4, tokenizer=False, max_context=12)
    r = host_runner(small, monkeypatch)
    sessions = [small.new_session() for _ in range(len(PROMPTS))]
    assert warm_up(small, sessions, GreedySteps(r))["batches"] == len(PROMPTS)
    assert all(s.position == 0 for s in sessions)


def test_a_failed_warm_up_is_logged_and_the_server_still_serves(monkeypatch, caplog):
    """The warm-up only saves the first requests their compiles: if it raises, the server warns
    and starts anyway, its slots empty."""
    pytest.importorskip("fastapi")
    from muser.server import service
    from muser.server.config import ServerConfig

    def broken(engine, sessions, steps=None):
        sessions[0].prefill([1, 2, 3], logits=False)
        raise RuntimeError("no graphs today")

    monkeypatch.setattr(service, "warm_up", broken)
    engine = tiny_model("gemma3", window=4)
    with caplog.at_level("WARNING", logger="muser.server"):
        state = service.ServerState(engine, ServerConfig(slots=2))
    assert "warm-up failed (RuntimeError: no graphs today)" in caplog.text
    assert len(state.pool.slots) == 2
