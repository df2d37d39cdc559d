"""Slot placement, the bounded queue and the health latch as pure logic (stand-in sessions)."""
from __future__ import annotations

import asyncio

import pytest

from muser.server.http_errors import Overloaded, SlotBusy, Unavailable
from muser.server.slots import Candidate, SlotPool, choose, extension


class FakeSession:                      # only what placement reads: the consumed ids
    def __init__(self, tokens=()):
        self.tokens = list(tokens)


def pool(*token_lists, **kw):
    return SlotPool([FakeSession(t) for t in token_lists], FakeSession(), **kw)


def fixed(prompt, shifted=False):
    c = Candidate(list(prompt), None, shifted)
    return lambda slot: c


def test_extension_is_strict_prefix_only():
    assert extension([1, 2], [1, 2, 3]) == 2
    assert extension([1, 2, 3], [1, 2, 3]) == 0      # nothing left to prefill: cannot reuse
    assert extension([1, 9], [1, 2, 3]) == 0          # no truncate op: partial overlap is useless
    assert extension([], [1]) == 0


def test_choose_prefers_longest_extension_then_lru():
    p = pool([1], [1, 2, 3], [7], [])
    for s, t in zip(p.slots, (3, 1, 2, 4)):
        s.last_used = t
    pl = choose(p.slots, fixed([1, 2, 3, 4]))
    assert pl.slot.id == 1 and pl.reuse == 3 and not pl.rebuild
    pl = choose(p.slots, fixed([5, 6]))
    assert pl.slot.id == 1 and pl.reuse == 0          # least recently used (tick 1)
    pl = choose(p.slots, fixed([5, 6], shifted=True))
    assert pl.rebuild                                  # a shifted plan without reuse rebuilds


def test_choose_prefers_own_lineage_over_lru():
    p = pool([1], [2])
    p.slots[0].last_used, p.slots[1].last_used = 1, 2
    mine = Candidate([9, 9], None, True, lineage=True)
    other = Candidate([9, 9], None, True)
    pl = choose(p.slots, lambda s: mine if s.id == 1 else other)
    assert pl.slot.id == 1 and pl.lineage and pl.rebuild


def test_queue_fifo_bound_timeout_and_latch():
    async def run():
        p = pool([], max_queue=2, queue_timeout=0.2)
        p.loop = asyncio.get_running_loop()
        first = await p.acquire(fixed([1]))
        assert first.slot.busy
        w1 = asyncio.ensure_future(p.acquire(fixed([2])))
        w2 = asyncio.ensure_future(p.acquire(fixed([3])))
        await asyncio.sleep(0)
        assert p.queue_depth == 2
        with pytest.raises(Overloaded, match="queue is full"):
            await p.acquire(fixed([4]))
        with pytest.raises(SlotBusy):
            p.lease_slot(0)
        p.release(first.slot)                      # handed to the oldest waiter, not stolen
        got = await w1
        assert got.prompt == [2] and got.slot.busy
        with pytest.raises(Overloaded, match="waited 0.2s"):
            await w2
        assert p.queue_depth == 0
        w3 = asyncio.ensure_future(p.acquire(fixed([5])))
        await asyncio.sleep(0)
        p.latch_unhealthy("boom")
        with pytest.raises(Unavailable, match="boom"):
            await w3
        with pytest.raises(Unavailable):
            await p.acquire(fixed([6]))
        p.latch_unhealthy("second reason")         # the first reason sticks
        assert p.unhealthy_reason == "boom"
    asyncio.run(run())


def test_cancelled_waiter_does_not_leak_a_slot():
    async def run():
        p = pool([], max_queue=4, queue_timeout=5)
        p.loop = asyncio.get_running_loop()
        first = await p.acquire(fixed([1]))
        w = asyncio.ensure_future(p.acquire(fixed([2])))
        await asyncio.sleep(0)
        w.cancel()
        p.release(first.slot)                      # races the cancellation on purpose
        with pytest.raises(asyncio.CancelledError):
            await w
        assert p.busy_count == 0 and p.queue_depth == 0
    asyncio.run(run())


def test_publish_staging_swaps_and_advances_epoch():
    p = pool([1, 2])
    live, staging = p.slots[0].session, p.staging
    p.publish_staging(p.slots[0])
    assert p.slots[0].session is staging and p.staging is live and p.slots[0].epoch == 1
