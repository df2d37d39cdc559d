"""Greedy decode rounds one step ahead (`--pipeline on`, server/pipeline.py): many clients at
once get exactly the answers of the plain rounds (`--pipeline off`) -- max_tokens, stop strings,
an end of turn, a later turn that reuses the live session, a client that leaves mid-stream, a
sampled request that lands the step in flight -- and every slot's session stays consistent
(its lineage is its position) with nothing left in flight.  On the CPU the steps run one at a
time underneath (SyncSteps); the extra step of a choice that ends is really taken back, so the
later turns would part from the plain server's if it were not."""
from __future__ import annotations

import asyncio

from server_harness import chat_burst, serve

WORDS = "the quick brown fox jumps over the lazy dog hybrid attention ring growing".split()


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{WORDS[i % len(WORDS)]} {WORDS[(5 * i) % len(WORDS)]} {i}"}]


def run_all(srv):
    """A burst of greedy chats (several budgets), then completions with stop strings, then a
    second turn of two conversations (their slots' live sessions extended), then a sampled
    request beside greedy ones."""
    first = chat_burst(srv, [(prompt(i), 2 + (3 * i) % 7) for i in range(10)])
    c = srv.client()
    stops = [c.completions.create(model="tiny", prompt=f"{WORDS[i]} {WORDS[i + 1]}", max_tokens=12,
                                  temperature=0, stop=[WORDS[(i + 3) % len(WORDS)][:2], "e"])
             .choices[0].text for i in range(6)]
    turns = []
    for i in range(2):
        msgs = prompt(i)
        r = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
        msgs = msgs + [{"role": "assistant", "content": r.choices[0].message.content},
                       {"role": "user", "content": "and again"}]
        r2 = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0)
        turns.append((r.choices[0].message.content, r2.choices[0].message.content,
                      r2.usage.completion_tokens))

    async def mixed():
        ac = srv.async_client()
        try:
            return await asyncio.gather(
                *(ac.chat.completions.create(model="tiny", messages=prompt(20 + i), max_tokens=6,
                                             temperature=0.9 if i == 1 else 0, seed=3)
                  for i in range(3)))
        finally:
            await ac.close()
    mix = [r.choices[0].message.content for r in asyncio.run(mixed())]
    return first, stops, turns, mix


def leave_mid_stream(srv):
    """A streamed chat the client drops after two chunks, then the same request again."""
    c = srv.client()
    stream = c.chat.completions.create(model="tiny", messages=prompt(3), max_tokens=30,
                                       temperature=0, stream=True)
    for n, _ in enumerate(stream):
        if n == 2:
            break
    stream.close()
    srv.wait_idle()
    r = c.chat.completions.create(model="tiny", messages=prompt(3), max_tokens=8, temperature=0)
    return r.choices[0].message.content


def consistent(srv):
    srv.wait_idle()
    sched = srv.state.scheduler
    assert sched._flight is None or all(c.done for _, c in sched._flight.members)
    for slot in srv.state.pool.slots:
        slot.session.check_invariants()


def counted(steps):
    """Count the pipeline's launches and take-backs (the test must exercise both)."""
    n = {"launch": 0, "take_back": 0}
    for name in n:
        real = getattr(steps, name)

        def wrap(*a, real=real, name=name):
            n[name] += 1
            return real(*a)
        setattr(steps, name, wrap)
    return n


def test_rounds_one_step_ahead_answer_as_the_plain_rounds(tiny):
    results, n = {}, None
    for mode in ("off", "on"):
        with serve(tiny, model_id="tiny", slots=4, output_reserve=32, pipeline=mode) as srv:
            steps = srv.state.scheduler.steps
            assert (steps is not None) == (mode == "on")
            n = counted(steps) if steps is not None else n
            results[mode] = (run_all(srv), leave_mid_stream(srv))
            consistent(srv)
    assert results["on"] == results["off"]
    assert n["launch"] > 20 and n["take_back"] > 0
    assert (srv.state.metrics.value("steps_ahead_total"), srv.state.metrics.value(
        "steps_taken_back_total")) == (n["launch"], n["take_back"])


def test_a_choice_that_ends_leaves_its_session_holding_what_the_plain_round_leaves(tiny):
    """One client at a time (each slot's history the same in both servers): after answers that
    end at a stop string and at max_tokens, every slot's session holds the same lineage as the
    plain server's -- the extra step of a choice that ended was given back.  (A client that
    leaves mid-stream is noticed after a number of tokens that depends on timing: the first
    test checks its session is consistent, not its length.)"""
    lineages = {}
    for mode in ("off", "on"):
        with serve(tiny, model_id="tiny", slots=2, output_reserve=32, pipeline=mode) as srv:
            c = srv.client()
            for i in range(4):
                c.completions.create(model="tiny", prompt=f"{WORDS[i]} {WORDS[i + 2]}",
                                     max_tokens=10, temperature=0, stop=["io", "y", "e"])
                c.chat.completions.create(model="tiny", messages=prompt(i), max_tokens=4,
                                          temperature=0)
            for i in (0, 1):              # the last answers end at a stop string, mid-run
                r = c.completions.create(model="tiny", prompt=f"{WORDS[i]} {WORDS[i + 2]}",
                                         max_tokens=10, temperature=0, stop=["io", "y"])
                assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens > 2
            consistent(srv)
            lineages[mode] = [list(s.session.tokens) for s in srv.state.pool.slots]
    assert lineages["on"] == lineages["off"]


def test_several_choices_and_the_context_end_answer_as_the_plain_rounds(tiny):
    """n = 3 choices of one request (forked sessions, reset when the request ends) and an answer
    cut by the context's end (the step in flight must not run past it): the plain rounds'
    answers, finish reasons and slot lineages."""
    got = {}
    for mode in ("off", "on"):
        with serve(tiny, model_id="tiny", slots=2, max_context=48, output_reserve=8,
                   context_policy="error", pipeline=mode) as srv:
            c = srv.client()
            r = c.completions.create(model="tiny", prompt="the quick brown fox", max_tokens=9,
                                     temperature=0, n=3, stop=["y"])
            many = [(x.text, x.finish_reason) for x in r.choices]
            long = c.completions.create(model="tiny", prompt=" ".join(WORDS[:6]), max_tokens=40,
                                        temperature=0)
            edge = (long.choices[0].text, long.choices[0].finish_reason, long.usage.completion_tokens)
            consistent(srv)
            got[mode] = (many, edge, [list(s.session.tokens) for s in srv.state.pool.slots])
    assert got["on"] == got["off"]
    assert got["on"][1][1] == "length" and got["on"][1][2] < 40      # the context's end
