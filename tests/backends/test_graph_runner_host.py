"""The CUDA graph runner's host-side bookkeeping, on the CPU (backends/cuda/graph.py, eager
mode): per plane group one `advance_lockstep` per step, the packed inputs (ids | positions |
per group (slot, n) per row), plane-table rows and their re-upload when a growing plane moves,
checkpoints, and the transactional guarantee.  The kernels are replaced by a plain-torch step
that writes each new K/V row where the packed (slot, n) says and nowhere else; a twin set of
planes fed the same rows through `Plane.store` must end bit for bit the same."""
import pytest
import torch

from muser.backends.cuda.graph import GraphRunner
from muser.backends.cuda.triton_decode import plane_row
from muser.cache import build_planes
from muser.testing import tiny_model

WINDOW = 4


def row(position: int, layer: int, kv: int, d: int) -> torch.Tensor:
    """The K (and, negated, V) row the fake step writes for `position` in `layer`."""
    return torch.arange(kv * d, dtype=torch.float32).view(kv, d) + 1000.0 * position + layer


class PlainStep:
    """Stands in for DecodeStep: reads the packed inputs as the kernels do and stores each row."""
    fused_pick = False                   # logits out; the greedy graph picks from them

    def __init__(self, runner):
        self.runner, self.seen, self.fail = runner, [], False

    def workspace(self, batch):
        return None

    def run(self, packed, tables, ws):
        if self.fail:
            raise RuntimeError("injected kernel fault")
        r = self.runner
        B = tables.shape[1]
        ids, pos = packed[:B].tolist(), packed[B:2 * B].tolist()
        metas = [packed[2 * B + 2 * B * g: 2 * B + 2 * B * (g + 1)].view(B, 2).tolist()
                 for g in range(len(r.group_kinds))]
        self.seen.append((ids, pos, metas, tables.clone()))
        planes = {p.keys.data_ptr(): p for v in list(r._views.values()) for p in v.planes}
        for i, g in enumerate(r.layer_group):
            for b in range(B):
                slot, n = metas[g][b]
                p = planes[int(tables[i, b, 0])]
                assert n == p.len and int(tables[i, b, 1]) == p.values.data_ptr()
                k = row(pos[b], i, p.kv_heads, p.head_dim).to(p.dtype)
                if p.head_major:
                    p.keys[:, slot], p.values[:, slot] = k, -k
                else:
                    p.keys[slot], p.values[slot] = k, -k
        return torch.zeros(B, r.engine.spec.vocab_size)


@pytest.fixture
def engine():
    return tiny_model("gemma3", window=WINDOW, tokenizer=False, max_context=1024)


@pytest.fixture
def runner(engine):
    r = GraphRunner(engine, capture=False)
    r.step = PlainStep(r)
    return r


def start(engine, n, seed):
    """A session at position n (rows written through Plane.store) and its twin planes."""
    s = engine.new_session()
    twin = build_planes(engine.spec.layers, "ring", engine.max_context, engine.spec.num_kv_heads,
                        engine.spec.head_dim, engine.cache_dtype, "cpu")
    for planes in (s.planes, twin):
        for i, p in enumerate(planes):
            for q in range(n):
                k = row(q + seed, i, p.kv_heads, p.head_dim)
                p.store(q, k[None], -k[None])
    s.tokens = [3] * n
    return s, twin


def step_twin(twin, position):
    for i, p in enumerate(twin):
        k = row(position, i, p.kv_heads, p.head_dim)
        p.store(position, k[None], -k[None])


def same(planes, twin):
    for a, b in zip(planes, twin):
        assert a.metadata() == b.metadata()
        ka, va = a.logical_rows()
        kb, vb = b.logical_rows()
        assert torch.equal(ka, kb) and torch.equal(va, vb)


def test_sessions_at_different_lengths_advance_as_plane_store_would(engine, runner):
    pairs = [start(engine, n, seed) for n, seed in ((1, 0), (3, 0), (4, 0), (9, 0))]
    sessions = [s for s, _ in pairs]
    for step in range(7):                                  # every ring wraps; growing planes grow
        positions = [s.position for s in sessions]
        toks = [5 + step + i for i in range(len(sessions))]
        out = runner.decode(sessions, toks)
        assert out.shape == (len(sessions), engine.spec.vocab_size)
        ids, pos, metas, _ = runner.step.seen[-1]
        assert ids == toks and pos == positions
        for (s, twin), p in zip(pairs, positions):
            step_twin(twin, p)
            assert s.tokens[-1] == toks[sessions.index(s)]
    for s, twin in pairs:
        same(s.planes, twin)
        s.check_invariants()
    assert runner.stats["eager"] == 7 and runner.stats["captures"] == 0


def test_packed_slots_are_the_slots_plane_store_uses(engine, runner):
    s, twin = start(engine, 6, 0)
    runner.decode([s], [7])
    _, _, metas, tables = runner.step.seen[-1]
    for i, g in enumerate(runner.layer_group):
        p = twin[i]
        slot, n = metas[g][0]
        assert slot == p.slot(6) if p.kind == "ring" else slot == 6
        assert tables[i, 0].tolist() == plane_row(s.planes[i])
    assert len(runner.group_kinds) == 2 and {k[0] for k in runner.group_kinds} == {"ring", "growing"}


def test_plane_tables_are_uploaded_again_only_when_a_growing_plane_moves(engine, runner):
    s, twin = start(engine, 250, 0)                        # growing planes hold 256 rows
    runner.decode([s], [1])
    uploads = runner.stats["table_uploads"]
    for t in range(4):
        runner.decode([s], [2])                            # positions 251..254: no growth
    assert runner.stats["table_uploads"] == uploads
    for t in range(3):
        runner.decode([s], [3])                            # 255, then 256: the growing planes move
    assert runner.stats["table_uploads"] == uploads + 1
    for p in range(250, s.position):
        step_twin(twin, p)
    same(s.planes, twin)


def test_steps_inside_a_checkpoint_roll_back_to_the_kept_rows(engine, runner):
    s, twin = start(engine, 5, 0)
    cp = s.checkpoint(3)
    runner.decode([s], [4])
    runner.decode([s], [5])
    runner.decode([s], [6])                                # evicts ring rows: logged, not lost
    s.rollback(cp, 1)
    step_twin(twin, 5)
    same(s.planes, twin)
    assert s.tokens == [3] * 5 + [4]
    runner.decode([s], [8])                                # and it carries on from there
    step_twin(twin, 6)
    same(s.planes, twin)


def test_a_failed_step_leaves_every_session_as_it_was(engine, runner):
    pairs = [start(engine, n, 0) for n in (2, 8)]
    sessions = [s for s, _ in pairs]
    runner.step.fail = True
    with pytest.raises(RuntimeError, match="injected"):
        runner.decode(sessions, [1, 2])
    for s, twin in pairs:
        same(s.planes, twin)
        assert len(s.tokens) == twin[0].end
        s.check_invariants()
    runner.step.fail = False
    runner.decode(sessions, [1, 2])
    for (s, twin), p in zip(pairs, (2, 8)):
        step_twin(twin, p)
        same(s.planes, twin)


def test_the_cuda_backend_sends_decode_shapes_to_the_runner_and_the_rest_to_the_one_forward(engine):
    """CudaBackend.forward on the CPU: one-row unpadded steps -> runner; chunks -> backends/step.py."""
    from muser.backends.cuda import CudaBackend
    backend = CudaBackend(engine.config, engine.env)
    calls = []

    class Runner:
        def decode(self, sessions, tokens):
            calls.append(("runner", tokens))
            return torch.zeros(len(tokens), engine.spec.vocab_size)
    backend._runner = Runner()
    a, b = engine.new_session(), engine.new_session()
    backend.forward(engine, [a, b], [[4], [5]], False, False)
    assert calls == [("runner", [4, 5])]
    out = backend.forward(engine, [a], [[6, 7]], True, True)          # a chunk: the eager forward
    assert calls == [("runner", [4, 5])] and out.shape == (2, engine.spec.vocab_size)
    assert a.tokens == [6, 7]
    backend.reset_runner()
    assert backend._runner is None
