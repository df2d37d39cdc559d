"""The HTTP server on a CUDA engine: the graph runner behind the scheduler's batched decode,
with the real `openai` client.  Skips without a GPU (and without the server's packages)."""
import os
import sys

import pytest
from cudautil import needs_gpu

pytest.importorskip("fastapi")
pytest.importorskip("openai")
pytestmark = needs_gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "server"))
from server_harness import chat_burst, serve  # noqa: E402


@pytest.fixture(scope="module")
def served():
    from muser.testing import tiny_model
    engine = tiny_model(device="cuda", dtype="bfloat16", window=4)
    with serve(engine, model_id="tiny", slots=4, output_reserve=32) as srv:
        yield srv


def ask(i: int) -> list[dict]:
    return [{"role": "user", "content": f"tell me about item {i} and {3 * i}"}]


def test_a_request_served_alone_equals_engine_generate(served):
    """One active slot decodes through the batch-1 graph, exactly as engine.generate does."""
    engine = served.state.engine
    r = served.client().chat.completions.create(model="tiny", messages=ask(1), max_tokens=12,
                                                temperature=0)
    ids = engine.tokenizer.apply_chat_template(ask(1))
    want = engine.generate(ids, max_tokens=12)
    assert r.choices[0].message.content == want
    assert r.usage.prompt_tokens == len(ids)


def test_eight_clients_at_once_all_complete_and_batch_on_the_gpu(served):
    served.wait_idle()
    runner = served.state.engine.decode_runner()
    assert runner is not None                       # the scheduler's decode goes through CUDA graphs
    replays = runner.stats["replays"]

    results = chat_burst(served, [(ask(i), 10) for i in range(8)])
    assert len(results) == 8
    assert all(1 <= n <= 10 for _, n in results)
    served.wait_idle()
    assert served.state.pool.busy_count == 0 and served.state.pool.queue_depth == 0
    assert runner.stats["replays"] > replays
    print("graph runner after the burst:", runner.stats)
    metrics = served.http().get("/metrics").text
    assert "muser_decode_seconds_count" in metrics


def test_a_second_turn_reuses_the_gpu_cache(served):
    c = served.client()
    first = c.completions.create(model="tiny", prompt=[2] + list(range(10, 60)), max_tokens=1, temperature=0)
    second = c.completions.create(model="tiny", prompt=[2] + list(range(10, 60)) + [70, 71], max_tokens=1,
                                  temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == 51


def test_rounds_one_step_ahead_answer_as_the_plain_rounds_on_the_gpu():
    """`--pipeline auto` takes the graph runner's GreedySteps (cuda/greedy.py) on CUDA: a burst
    of clients, stop strings, later turns and a sampled neighbour get the plain rounds'
    answers, and every slot's session is consistent after (tests/server/test_server_pipeline.py
    runs the same on the CPU)."""
    from test_server_pipeline import consistent, run_all

    from muser.testing import tiny_model
    engine = tiny_model(device="cuda", dtype="bfloat16", window=4)
    got = {}
    for mode in ("off", "auto"):
        with serve(engine, model_id="tiny", slots=4, output_reserve=32, pipeline=mode) as srv:
            assert (srv.state.scheduler.steps is not None) == (mode == "auto")
            got[mode] = run_all(srv)
            consistent(srv)
    assert got["auto"] == got["off"]


def test_the_warm_up_captures_every_batch_size_before_the_first_request():
    """engine/warmup.py at start: batch sizes 1..slots captured (the greedy graphs of
    `--pipeline auto`) before the port opens, the slots' sessions empty; `warmup=False` leaves
    the first step of each batch size to the first requests."""
    from muser.testing import tiny_model
    for warm in (False, True):
        engine = tiny_model(device="cuda", dtype="bfloat16", window=4)
        with serve(engine, model_id="tiny", slots=4, output_reserve=32, warmup=warm) as srv:
            stats = engine.runner_stats()
            assert (stats.get("captures", 0) >= 4) == warm, stats
            assert all(s.session.position == 0 for s in srv.state.pool.slots)
            r = srv.client().chat.completions.create(model="tiny", messages=ask(2), max_tokens=8,
                                                     temperature=0)
            ids = engine.tokenizer.apply_chat_template(ask(2))
            assert r.choices[0].message.content == engine.generate(ids, max_tokens=8)
