"""Hypothesis drives random append / snapshot / install / checkpoint / rollback
sequences on tiny planes against a plain-Python model of the logical rows."""
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from muser.cache import Checkpoint, GrowingPlane, RingPlane
from muser.errors import CacheDiscontinuity, CacheError, CheckpointError

MAX_CONTEXT = 40


def rows(n, kv, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, kv, d, generator=g), torch.randn(n, kv, d, generator=g)


def make_plane(kind, capacity, kv, d):
    if kind == "ring":
        return RingPlane(0, capacity, MAX_CONTEXT, kv, d, torch.float32, "cpu")
    return GrowingPlane(0, MAX_CONTEXT, kv, d, torch.float32, "cpu", min_rows=2)


class PlaneMachine(RuleBasedStateMachine):
    @initialize(kind=st.sampled_from(["ring", "growing"]), capacity=st.integers(1, 9),
                kv=st.integers(1, 3), d=st.sampled_from([1, 2, 4]))
    def setup(self, kind, capacity, kv, d):
        self.kv, self.d = kv, d
        self.plane = make_plane(kind, capacity, kv, d)
        self.model_k, self.model_v = [], []     # row of every position ever kept
        self.cp = None
        self.cp_start = None
        self.cp_budget = 0

    def live_range(self):
        n = len(self.model_k)
        count = min(n, self.plane.capacity) if self.plane.kind == "ring" else n
        return n - count, n

    def state(self):
        p = self.plane
        return p.metadata(), p.keys.clone(), p.values.clone()

    def assert_unchanged(self, before):
        meta, k, v = before
        assert self.plane.metadata() == meta
        assert torch.equal(self.plane.keys, k) and torch.equal(self.plane.values, v)

    @rule(n=st.integers(0, 12), seed=st.integers(0, 10**6), skew=st.sampled_from([0, 0, 0, -1, 1, 3]))
    def store(self, n, seed, skew):
        k, v = rows(n, self.kv, self.d, seed)
        start = self.plane.end + skew
        before = self.state()
        fits = start + n <= MAX_CONTEXT and (self.cp is None or self.cp.logs[0].stored + n <= self.cp_budget)
        try:
            self.plane.store(start, k, v)
        except CacheDiscontinuity as e:
            assert skew != 0 and e.expected == before[0]["origin_logical"] + before[0]["len"] and e.got == start
            self.assert_unchanged(before)
            return
        except CacheError:
            assert not fits
            self.assert_unchanged(before)
            return
        assert skew == 0 and fits
        self.model_k.extend(k)
        self.model_v.extend(v)

    @rule()
    def snapshot_matches_model(self):
        k, v = self.plane.logical_rows()
        a, b = self.live_range()
        assert self.plane.origin_logical == a and self.plane.len == b - a
        want_k = torch.stack(self.model_k[a:b]) if b > a else torch.zeros(0, self.kv, self.d)
        want_v = torch.stack(self.model_v[a:b]) if b > a else torch.zeros(0, self.kv, self.d)
        assert torch.equal(k, want_k) and torch.equal(v, want_v)

    @precondition(lambda self: self.cp is None)
    @rule()
    def install_into_fresh_plane(self):
        k, v = self.plane.logical_rows()
        fresh = make_plane(self.plane.kind, self.plane.capacity, self.kv, self.d)
        fresh.install(self.plane.origin_logical, k, v)
        fresh.check_invariants()
        assert fresh.metadata() == self.plane.metadata()
        k2, v2 = fresh.logical_rows()
        assert torch.equal(k, k2) and torch.equal(v, v2)
        self.plane = fresh          # continue the run on the restored plane

    @precondition(lambda self: self.cp is None)
    @rule(budget=st.integers(0, 12))
    def checkpoint(self, budget):
        self.cp = Checkpoint([self.plane], self.plane.end, budget)
        self.cp_start, self.cp_budget = self.plane.end, budget

    @precondition(lambda self: self.cp is None)
    @rule(n=st.integers(1, 12), frac=st.floats(0, 1), seed=st.integers(0, 10**6), split=st.booleans())
    def speculative_round(self, n, frac, seed, split):
        """checkpoint -> store a block (in one chunk or two) -> rollback to a kept prefix."""
        n = min(n, MAX_CONTEXT - self.plane.end)
        start = self.plane.end
        cp = Checkpoint([self.plane], start, n)
        k, v = rows(n, self.kv, self.d, seed)
        cut = n // 2 if split else n
        self.plane.store(start, k[:cut], v[:cut])
        self.plane.store(start + cut, k[cut:], v[cut:])
        assert cp.retained_rows()[0] <= n
        assert cp.retained_bytes()[0] <= n * self.plane.row_bytes()
        keep = int(round(frac * n))
        cp.rollback(keep)
        self.model_k.extend(k[:keep])
        self.model_v.extend(v[:keep])

    @precondition(lambda self: self.cp is not None)
    @rule(frac=st.floats(0, 1))
    def rollback(self, frac):
        stored = self.cp.logs[0].stored
        assert self.cp.logs[0].retained_rows() <= self.cp_budget
        keep = int(round(frac * stored))
        self.cp.rollback(keep)
        del self.model_k[self.cp_start + keep:]
        del self.model_v[self.cp_start + keep:]
        self.cp = None

    @precondition(lambda self: self.cp is not None)
    @rule()
    def commit(self):
        self.cp.commit()
        self.cp = None

    @precondition(lambda self: self.cp is not None)
    @rule()
    def rollback_with_bad_keep_is_refused(self):
        before = self.state()
        try:
            self.cp.rollback(self.cp.logs[0].stored + 1)
        except CheckpointError:
            self.assert_unchanged(before)
        else:
            raise AssertionError("rollback past what was stored must be refused")

    @invariant()
    def invariants_hold(self):
        if hasattr(self, "plane"):
            self.plane.check_invariants()


TestPlaneMachine = PlaneMachine.TestCase
TestPlaneMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
