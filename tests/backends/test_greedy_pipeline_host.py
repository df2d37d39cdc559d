"""The CUDA greedy pipeline's host side, on the CPU (backends/cuda/greedy.py, eager mode): step
N+1 is launched before step N's picks are read, so a session that a pick ends has taken one
step too many and gives it back with `Plane.rewind`.  Against the same runner stepped one call
at a time (`GraphRunner.decode` + the same pick), every run must give the same tokens, the same
finishes, the same lineages and the same live rows -- a taken-back ring holding the same rows
but the oldest -- and a session must carry on from there exactly as the other one does.

The kernels are replaced by a plain-torch step (the graph runner host test's `PlainStep`) whose
logits put one maximum at a token that is a function of the fed id and the position, so that
every pick depends on the pick before it."""
import pytest
import torch

from test_graph_runner_host import PlainStep, start

from muser.backends.cuda.graph import GraphRunner
from muser.backends.greedy import Budget, Greedy, greedy_rows, settle
from muser.testing import tiny_model


class PickStep(PlainStep):
    """PlainStep's rows, and logits whose maximum is at next_token(id, position); positions in
    `nan_at` give a row of NaN."""

    def __init__(self, runner, nan_at=()):
        super().__init__(runner)
        self.nan_at = set(nan_at)

    def run(self, packed, tables, ws):
        logits = super().run(packed, tables, ws)
        B = tables.shape[1]
        ids, pos = packed[:B].tolist(), packed[B:2 * B].tolist()
        for b in range(B):
            logits[b, next_token(ids[b], pos[b], logits.shape[1])] = 1.0
            if pos[b] in self.nan_at:
                logits[b] = float("nan")
        return logits


def next_token(token: int, position: int, vocab: int) -> int:
    return (token * 31 + position * 7 + 3) % vocab


@pytest.fixture
def engine():
    return tiny_model("gemma3", window=4, tokenizer=False, max_context=1024)


def runner_for(engine, nan_at=()):
    r = GraphRunner(engine, capture=False)
    r.step = PickStep(r, nan_at)
    return r


def stepwise(runner, sessions, run: Budget) -> Greedy:
    """The reference: one `decode` call a step, its picks read before the next."""
    out = Greedy([[] for _ in sessions], ["length"] * len(sessions))
    feed = list(run.tokens)
    live = [b for b, m in enumerate(run.budgets) if m > 0]
    while live:
        best, ok = greedy_rows(runner.decode([sessions[b] for b in live], [feed[b] for b in live]))
        nxt = []
        for j, b in enumerate(live):
            if settle(b, int(best[j]), bool(ok[j]), run, out):
                feed[b] = int(best[j])
                nxt.append(b)
        live = nxt
    return out


def fail_at(runner, n: int) -> None:
    """The runner's n-th step from now raises (an injected kernel fault); the others run."""
    real, calls = runner.step.run, {"n": 0}

    def failing(packed, tables, ws):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("injected kernel fault")
        return real(packed, tables, ws)
    runner.step.run = failing


def twins(engine, lengths):
    return ([start(engine, n, 0)[0] for n in lengths], [start(engine, n, 0)[0] for n in lengths])


def same_live_rows(piped, ref):
    """Equal ends and lineages; each plane holds the reference's rows, a taken-back ring all but
    the oldest: still every row the next position reads (window - 1 before it)."""
    assert piped.position == ref.position and piped.tokens == ref.tokens
    piped.check_invariants()
    for a, b in zip(piped.planes, ref.planes):
        ka, va = a.logical_rows()
        kb, vb = b.logical_rows()
        assert a.len in (b.len, b.len - 1) and (a.kind == "ring" or a.len == b.len)
        assert a.kind == "growing" or a.len >= min(a.end, a.window - 1)
        assert torch.equal(ka, kb[b.len - a.len:]) and torch.equal(va, vb[b.len - a.len:])


# lengths: where each session starts (rings of 4 wrap at once); budgets; a stop id per case
CASES = [
    ("budgets only", (1, 3, 9), (5, 1, 7), ()),
    ("one stops mid-run, the batch shrinks", (2, 6, 11), (8, 8, 8), "first pick of session 1 at step 3"),
    ("every session stops", (3, 3), (6, 6), "first pick of session 0 at step 2"),
    ("a zero budget", (4, 5), (0, 4), ()),
]


@pytest.mark.parametrize("name,lengths,budgets,stop", CASES, ids=[c[0] for c in CASES])
def test_a_pipelined_run_gives_the_stepwise_tokens_lineages_and_rows(engine, name, lengths,
                                                                   budgets, stop):
    first = [7 + i for i in range(len(lengths))]
    stops = ()
    if stop:                                # a token the reference produces mid-run
        b, i = int(stop.split("session ")[1][0]), int(stop.rsplit("step ", 1)[1])
        probe, _ = twins(engine, lengths)
        probe_out = stepwise(runner_for(engine), probe,
                             Budget.check(engine, probe, first, list(budgets), ()))
        stops = (probe_out.tokens[b][i],)
    piped_s, ref_s = twins(engine, lengths)
    r_piped, r_ref = runner_for(engine), runner_for(engine)
    got = r_piped.greedy(piped_s, Budget.check(engine, piped_s, first, list(budgets), stops))
    want = stepwise(r_ref, ref_s, Budget.check(engine, ref_s, first, list(budgets), stops))
    assert got == want
    if stop:
        assert "stop" in want.finish
    for a, b in zip(piped_s, ref_s):
        same_live_rows(a, b)
    # both carry on alike: a taken-back ring lost nothing a later query reads
    more_p = r_piped.greedy(piped_s, Budget.check(engine, piped_s, [3] * len(lengths), 5, ()))
    more_r = stepwise(r_ref, ref_s, Budget.check(engine, ref_s, [3] * len(lengths), 5, ()))
    assert more_p == more_r
    for a, b in zip(piped_s, ref_s):
        same_live_rows(a, b)


def test_a_row_without_a_finite_logit_ends_its_session_only(engine):
    piped_s, ref_s = twins(engine, (3, 8))
    got = runner_for(engine, nan_at={6}).greedy(piped_s, Budget.check(engine, piped_s, [1, 2], 6, ()))
    want = stepwise(runner_for(engine, nan_at={6}), ref_s,
                    Budget.check(engine, ref_s, [1, 2], 6, ()))
    assert got == want and got.finish == ["nonfinite", "length"] and len(got.tokens[0]) == 3
    for a, b in zip(piped_s, ref_s):
        same_live_rows(a, b)


def test_a_failed_launch_leaves_each_session_with_what_it_consumed(engine):
    sessions, _ = twins(engine, (2, 5))
    r = runner_for(engine)
    fail_at(r, 3)
    with pytest.raises(RuntimeError, match="injected"):
        r.greedy(sessions, Budget.check(engine, sessions, [1, 2], 6, ()))
    for s, n in zip(sessions, (2, 5)):
        s.check_invariants()                       # lineage == position: two steps consumed
        assert s.position == n + 2


def test_a_captured_batch_size_replays_the_ids_its_warm_up_consumed(engine, monkeypatch):
    """Capturing runs the step once eagerly (capture.py's warm-up), which writes that step's
    picks: into its own turn's buffer, never where the replay reads its ids (the other turn's).
    Here a stand-in capture warms up like the real one and replays by running the step again."""
    import muser.backends.cuda.capture as cap

    def fake_capture(fn, pool):
        fn()                                               # the warm-up

        class Graph:
            replay = staticmethod(fn)
        return Graph(), None
    monkeypatch.setattr(cap, "capture", fake_capture)
    piped_s, ref_s = twins(engine, (2, 7, 12))
    r = runner_for(engine)
    r.capture = True
    monkeypatch.setattr(r, "_pool", lambda: None)
    got = r.greedy(piped_s, Budget.check(engine, piped_s, [4, 5, 6], [9, 4, 9], ()))
    want = stepwise(runner_for(engine), ref_s, Budget.check(engine, ref_s, [4, 5, 6], [9, 4, 9], ()))
    assert got == want, (got, want)
    assert r.stats["captures"] == 4           # batch sizes 3, then 2: a graph for each turn
    for a, b in zip(piped_s, ref_s):
        same_live_rows(a, b)


def test_a_step_fed_partly_from_the_last_picks_and_partly_from_the_host(engine):
    """The server's case: a choice just prefilled (a host id) joins choices fed their picks on
    the device, in another order and batch size: each row consumes what it was given."""
    from muser.backends.cuda.greedy import GreedySteps
    from muser.backends.greedy import FromLast
    a, ref = twins(engine, (2, 5, 9))
    r, rr = runner_for(engine), runner_for(engine)
    steps = GreedySteps(r)
    first = steps.launch([a[0], a[1]], [4, 6])
    second = steps.launch([a[1], a[2], a[0]], [FromLast(1), 8, FromLast(0)])
    best1, _ = steps.collect(first)
    best2, ok2 = steps.collect(second)
    w1, _ = greedy_rows(rr.decode([ref[0], ref[1]], [4, 6]))
    w2, _ = greedy_rows(rr.decode([ref[1], ref[2], ref[0]], [int(w1[1]), 8, int(w1[0])]))
    assert best1 == w1.tolist() and best2 == w2.tolist() and all(ok2)
    for x, y in zip(a, ref):
        same_live_rows(x, y)
    steps.take_back(a[2])                          # and the last step goes back on its own
    rr_twin = twins(engine, (9,))[1][0]
    same_live_rows(a[2], rr_twin)


@pytest.mark.parametrize("failed_feed", [(0, 1), (1, 0)])
def test_a_launch_that_failed_does_not_feed_the_next_one_stale_picks(engine, failed_feed):
    """A launch that fails leaves its batch size's turn where it was (greedy.py `_Graphs`), and
    the last step's picks where that step left them -- also when the failed launch had patched
    them in place for a reordered feed (1, 0): the next launch, fed them in order, reads them
    intact."""
    from muser.backends.cuda.greedy import GreedySteps
    from muser.backends.greedy import FromLast
    a, ref = twins(engine, (3, 8))
    r, rr = runner_for(engine), runner_for(engine)
    steps = GreedySteps(r)
    first = steps.launch(a, [4, 6])
    fail_at(r, 1)
    with pytest.raises(RuntimeError, match="injected"):
        steps.launch(a, [FromLast(j) for j in failed_feed])
    second = steps.launch(a, [FromLast(0), FromLast(1)])
    best1, _ = steps.collect(first)
    best2, _ = steps.collect(second)
    w1, _ = greedy_rows(rr.decode(ref, [4, 6]))
    w2, _ = greedy_rows(rr.decode(ref, w1.tolist()))
    assert best1 == w1.tolist() and best2 == w2.tolist()
    for x, y in zip(a, ref):
        same_live_rows(x, y)
