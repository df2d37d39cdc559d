"""Many clients at once: answers equal the same request served alone; overload is a clean 429."""
from __future__ import annotations

import asyncio
import threading
import time

import openai

from server_harness import chat_burst, serve

WORDS = "the quick brown fox jumps over the lazy dog hybrid attention ring growing".split()


def prompt(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i) % len(WORDS)]} {i}"}]


def test_16_clients_on_4_slots_match_served_alone(tiny):
    with serve(tiny, model_id="tiny", slots=4, output_reserve=32) as srv:
        c = srv.client()
        alone = []
        for i in range(16):
            r = c.chat.completions.create(model="tiny", messages=prompt(i), max_tokens=3 + i % 4,
                                          temperature=0)
            alone.append((r.choices[0].message.content, r.usage.completion_tokens))
        srv.wait_idle()
        slow_down(srv, 0.01)                  # overlap for sure, even on a fast machine
        srv.state.scheduler.eos = set(srv.state.engine.spec.eos_token_ids) | set(
            srv.state.engine.tokenizer.eos_token_ids)

        seen_busy = []
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                seen_busy.append((srv.state.pool.busy_count, srv.state.pool.queue_depth))
                time.sleep(0.005)
        t = threading.Thread(target=watch)
        t.start()
        try:
            together = chat_burst(srv, [(prompt(i), 3 + i % 4) for i in range(16)])
        finally:
            stop.set()
            t.join()
        assert together == alone                          # no cross-talk, greedy-exact
        assert max(b for b, _ in seen_busy) == 4          # all slots used at once
        assert max(q for _, q in seen_busy) > 0           # and some requests queued
        srv.wait_idle()
        assert srv.state.pool.busy_count == 0 and srv.state.pool.queue_depth == 0


def slow_down(srv, seconds=0.05):
    """Make every decode step take a while, so requests really overlap on a fast machine."""
    srv.state.scheduler.eos = set()
    for slot in srv.state.pool.slots:
        real = slot.session.decode

        def slow(tok, real=real):
            time.sleep(seconds)
            return real(tok)
        slot.session.decode = slow


def test_queue_bound_and_wait_limit_give_429(tiny):
    with serve(tiny, model_id="tiny", slots=1, queue_size=1, queue_timeout=30,
               output_reserve=32) as srv:
        slow_down(srv)
        async def one(ac, i):
            try:
                r = await ac.completions.create(model="tiny", prompt=f"hello {i}", max_tokens=6,
                                                temperature=0)
                return r.usage.completion_tokens
            except openai.RateLimitError as e:
                assert e.body["type"] == "rate_limit_error" and "queue" in e.body["message"]
                return 429

        async def burst():
            ac = srv.async_client()
            try:
                return await asyncio.gather(*(one(ac, i) for i in range(5)))
            finally:
                await ac.close()
        out = asyncio.run(burst())
        assert out.count(429) >= 1 and all(x in (6, 429) for x in out) and out.count(6) >= 2
        srv.wait_idle()

    with serve(tiny, model_id="tiny", slots=1, queue_size=8, queue_timeout=0.3,
               output_reserve=32) as srv:
        slow_down(srv)
        async def burst2():
            ac = srv.async_client()
            try:
                long = asyncio.ensure_future(ac.completions.create(
                    model="tiny", prompt="a long one", max_tokens=30, temperature=0))
                await asyncio.sleep(0.2)
                try:
                    await ac.completions.create(model="tiny", prompt="waiter", max_tokens=2)
                    waited = "served"
                except openai.RateLimitError as e:
                    waited = e.body["message"]
                return (await long).usage.completion_tokens, waited
            finally:
                await ac.close()
        n, waited = asyncio.run(burst2())
        assert n == 30 and "waited 0.3s" in waited
        assert srv.http().get("/health").json()["status"] == "healthy"
