"""`Engine.decode_greedy` on CUDA (bfloat16): the pipelined run (cuda/greedy.py: step N+1
launched before step N is read back, a session that a pick ends taken back one step) gives the
tokens, finishes and lineages of the one-step-at-a-time run (MUSER_PIPELINE=off), and every
session then decodes the next tokens to the same logits bitwise -- through ring wraps, a batch
that shrinks as sessions stop, and batch sizes captured on first use."""
import pytest
import torch

from cudautil import needs_gpu

from muser.env import Env
from muser.testing import tiny_model

pytestmark = needs_gpu


@pytest.fixture(scope="module", params=["gemma3", "cohere2"])
def engine(request):
    return tiny_model(request.param, device="cuda", dtype="bfloat16", window=4, tokenizer=False)


def prefilled(engine, lengths):
    out = []
    for i, n in enumerate(lengths):
        s = engine.new_session()
        s.prefill([(5 * i + 7 * j) % 300 + 3 for j in range(n)])
        out.append(s)
    return out


def run(engine, pipeline, lengths, budgets, stops):
    engine.backend.reset_runner(Env(pipeline=pipeline))
    ss = prefilled(engine, lengths)
    got = engine.decode_greedy(ss, [11 + i for i in range(len(ss))], budgets, stop_ids=stops)
    after = [s.decode(17) for s in ss]                         # a taken-back ring carries on
    return got, ss, after, engine.backend.runner(engine).stats


@pytest.mark.parametrize("lengths,budgets", [((3, 9, 20, 33), (12, 5, 12, 9)),
                                             ((1, 2), (16, 16))])
def test_the_pipelined_run_is_the_stepwise_run(engine, lengths, budgets):
    plain, _, _, _ = run(engine, "off", lengths, budgets, ())
    # a stop id that ends one session mid-run (the batch shrinks), taken from the plain run
    stop = (plain.tokens[0][len(plain.tokens[0]) // 2],)
    want, ws, wafter, _ = run(engine, "off", lengths, budgets, stop)
    got, gs, gafter, stats = run(engine, "on", lengths, budgets, stop)
    assert got == want and "stop" in got.finish
    assert stats["captures"] >= 1 and stats["replays"] >= max(budgets)
    for a, b, la, lb in zip(gs, ws, gafter, wafter):
        assert a.tokens == b.tokens and a.position == b.position
        a.check_invariants()
        assert torch.equal(la, lb)


def test_a_greedy_stream_one_step_ahead_is_the_plain_stream(engine):
    """engine.stream at T=0 with MUSER_PIPELINE=on (generate.greedy_ahead through the runner's
    GreedySteps) == off: the tokens, and the session's lineage after max_tokens and after a
    caller that stops reading (a stop id mid-run: the pipelined run's test above)."""
    prompt = [(7 * j) % 300 + 3 for j in range(21)]
    out = {}
    for mode in ("off", "on"):
        engine.backend.reset_runner(Env(pipeline=mode))
        rows = []
        for max_tokens, take in ((12, None), (30, 3)):
            s = engine.new_session()
            got = []
            gen = engine.stream(prompt, max_tokens=max_tokens, session=s)
            for t in gen:
                got.append(t)
                if take is not None and len(got) == take:
                    gen.close()
                    break
            rows.append((got, list(s.tokens)))
        out[mode] = rows
    assert out["on"] == out["off"]


def test_a_batch_size_first_met_behind_a_busy_stream_runs_the_same(engine):
    """The pipeline's copies run on side streams (cuda/greedy.py): a batch size's buffers are
    zero-filled on the main stream when first met, and an upload on a side stream that does not
    wait for that fill loses to it when the main stream is busy (positions read as 0: NaN picks,
    'nonfinite').  Here the main stream spins ~20 ms first."""
    want, ws, wafter, _ = run(engine, "off", (4, 7, 10), (6, 6, 6), ())
    engine.backend.reset_runner(Env(pipeline="on"))
    ss = prefilled(engine, (4, 7, 10))
    torch.cuda._sleep(40_000_000)                              # the main stream, busy
    got = engine.decode_greedy(ss, [11, 12, 13], (6, 6, 6), stop_ids=())
    assert got == want and got.finish == ["length"] * 3
    for a, b, lb in zip(ss, ws, wafter):                       # run() decoded 17 after
        assert torch.equal(a.decode(17), lb)
        assert a.tokens == b.tokens and a.position == b.position


def test_a_failed_launch_leaves_the_next_one_the_last_picks(engine):
    """A launch that fails inside its graph's capture (here: the step raises) after patching the
    last picks in place for a reordered feed: the next launch, fed the last picks in order,
    gets them intact (cuda/greedy.py restores them from their copy down; the turn stays)."""
    from muser.backends.greedy import FromLast
    engine.backend.reset_runner(Env(pipeline="off"))
    ref = prefilled(engine, (3, 8))
    w1 = engine.decode_batch(ref, [4, 6]).argmax(-1).tolist()
    w2 = engine.decode_batch(ref, w1).argmax(-1).tolist()
    engine.backend.reset_runner(Env(pipeline="on"))
    steps = engine.greedy_steps()
    a = prefilled(engine, (3, 8))
    first = steps.launch(a, [4, 6])
    step = engine.decode_runner().step

    def failing(*args, **kw):
        raise RuntimeError("injected kernel fault")
    step.run = failing
    with pytest.raises(RuntimeError, match="injected"):
        steps.launch(a, [FromLast(1), FromLast(0)])
    del step.run
    second = steps.launch(a, [FromLast(0), FromLast(1)])
    assert steps.collect(first)[0] == w1 and steps.collect(second)[0] == w2
    for s, r in zip(a, ref):
        assert s.tokens == r.tokens and s.position == r.position
