"""Random put / lookup / install / pin / evict sequences against a plain-Python model of the store.

The model keeps cuts as token tuples and blocks as token prefixes, with the same byte formula,
the same LRU-leaves-first rule and the same pins; after every step the store must hold exactly
the model's cuts and bytes, and every installed hit must equal a cold prefill of its ids (chunks
aligned to the block size, so this holds on the float32 and the default path alike).
"""
import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from muser.store import CutStore

from store_ids import BLOCK, ids

STEMS = [ids(20, 100), ids(20, 100)[:12] + ids(8, 101), ids(20, 102)]   # two share 12 ids


class Model:
    """The store's policy in plain Python: no tensors, no hashing."""

    def __init__(self, budget: int, cut_bytes, block_bytes: int):
        self.budget, self.cut_bytes, self.block_bytes = budget, cut_bytes, block_bytes
        self.cuts: dict[tuple, list] = {}          # tokens -> [last_used, pins]
        self.clock = 0
        self.evictions = 0

    def used(self) -> int:
        blocks = {t[:(i + 1) * BLOCK] for t in self.cuts for i in range(len(t) // BLOCK)}
        return sum(self.cut_bytes(len(t)) for t in self.cuts) + len(blocks) * self.block_bytes

    def touch(self, t) -> None:
        self.clock += 1
        self.cuts[t][0] = self.clock

    def _victim(self):
        fallback = None
        for t in sorted(self.cuts, key=lambda u: self.cuts[u][0]):
            if self.cuts[t][1]:
                continue
            if not any(len(u) > len(t) and u[:len(t)] == t for u in self.cuts):
                return t
            fallback = fallback or t
        return fallback

    def shrink(self) -> None:
        while self.used() > self.budget and (v := self._victim()) is not None:
            del self.cuts[v]
            self.evictions += 1

    def put(self, t) -> bool:
        if t in self.cuts:
            self.touch(t)
            return True
        blocks = {u[:(i + 1) * BLOCK] for u in self.cuts for i in range(len(u) // BLOCK)}
        new = self.cut_bytes(len(t)) + sum(t[:(i + 1) * BLOCK] not in blocks for i in range(len(t) // BLOCK)) \
            * self.block_bytes
        if new > self.budget:
            return False
        self.cuts[t] = [0, 1]
        self.touch(t)
        self.shrink()
        self.cuts[t][1] = 0
        if self.used() > self.budget:
            del self.cuts[t]
            return False
        return True

    def longest(self, query, limit):
        best = None
        for t in self.cuts:
            if len(t) <= limit and tuple(query[:len(t)]) == t and (best is None or len(t) > len(best)):
                best = t
        return best


def test_store_matches_its_model(engine):
    layout = CutStore(engine, ram_bytes=1, block_size=BLOCK).layout
    row, prefix = layout.row_bytes(), len(layout.prefix)
    cut_bytes = lambda p: (layout.window_rows(p) + (p % BLOCK) * prefix) * row   # noqa: E731
    block_bytes = BLOCK * prefix * row
    budget = 3 * cut_bytes(20) + 5 * block_bytes
    cold: dict[tuple, object] = {}

    def cold_snapshot(t):
        if t not in cold:
            s = engine.new_session()
            s.prefill(list(t), chunk_size=BLOCK)
            cold[t] = (s.snapshot(), s.decode(7))
        return cold[t]

    class Machine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.store = CutStore(engine, ram_bytes=budget, block_size=BLOCK)
            self.model = Model(budget, cut_bytes, block_bytes)
            self.held = []                         # (hit, tokens)

        @rule(stem=st.integers(0, 2), n=st.integers(1, 20), extra=st.integers(0, 9))
        def put(self, stem, n, extra):
            t = tuple(STEMS[stem][:n] + ids(extra, 7 * n + stem)[:extra])
            s = engine.new_session()
            s.prefill(list(t), chunk_size=BLOCK)
            got = self.store.put(s)
            assert (got is not None) == self.model.put(t)

        @rule(stem=st.integers(0, 2), n=st.integers(1, 29), short=st.integers(0, 3))
        def lookup_and_install(self, stem, n, short):
            query = STEMS[stem][:n] + ids(9, 5)[:max(0, n - 20)]
            limit = len(query) - short
            hit = self.store.longest_prefix(query, limit=limit)
            want = self.model.longest(query, limit)
            assert (None if hit is None else hit.tokens) == want
            if hit is None:
                return
            s = engine.new_session()
            self.store.install(s, hit)
            self.model.touch(want)
            snap, logits = cold_snapshot(want)
            assert s.snapshot().equal(snap) and torch.equal(s.decode(7), logits)

        @rule(stem=st.integers(0, 2), n=st.integers(1, 29))
        def pin(self, stem, n):
            hit = self.store.longest_prefix(STEMS[stem][:n], record=False)
            if hit is not None:
                self.store.pin(hit)
                self.model.cuts[hit.tokens][1] += 1
                self.held.append(hit)

        @precondition(lambda self: self.held)
        @rule(i=st.integers(0, 5))
        def unpin(self, i):
            hit = self.held.pop(i % len(self.held))
            self.store.unpin(hit)
            self.model.cuts[hit.tokens][1] -= 1
            self.model.shrink()

        @rule(everything=st.booleans(), nbytes=st.integers(1, 4000))
        def evict(self, everything, nbytes):
            self.store.evict(None if everything else nbytes)
            start = self.model.used()
            while (everything or start - self.model.used() < nbytes) and (v := self.model._victim()) is not None:
                del self.model.cuts[v]
                self.model.evictions += 1

        @invariant()
        def agrees(self):
            self.store.check_invariants()
            st_ = self.store.stats()
            assert {c.tokens() for c in self.store.index.cuts.values()} == set(self.model.cuts)
            assert st_["bytes"]["ram"] == self.model.used() <= budget
            assert st_["evictions"]["ram"] == self.model.evictions

    Machine.TestCase.settings = settings(max_examples=25, stateful_step_count=14, deadline=None,
                                         suppress_health_check=list(HealthCheck))
    Machine.TestCase().runTest()
