"""Graph-captured decode on CUDA: one replay per step, for one session or several.

Owns: `GraphRunner` -- the plane bookkeeping of a decode step done on the host
(through `cache.many.advance_lockstep`, which is `Plane.advance`: the same
arithmetic `Plane.store` runs, undo logs included when a caller's checkpoint
is open), the per-step upload of ids/positions/(slot, n) and of the
plane tables when they change, one captured `DecodeStep` per batch size,
and the transactional guarantee (a refused or failed step leaves every
session as it was).  Does not own: the maths (decode_step.py) or the kernels.

Why it is graph-safe: plane storage never moves during a step (a growing
plane that must grow does so here, before the upload, and its new pointer
goes into the table), the attention grid is static (splits are a function of
the plane's capacity kind, rows per split a function of n), and lengths,
slots and positions are read by the kernels from device memory.

Plane groups: planes that move in lockstep -- every growing plane, and the
rings of one capacity -- share one (slot, n) per session.  A session's
planes always advance together, so one representative per group decides.
"""
from __future__ import annotations

import time
import weakref
from operator import attrgetter, is_not

import torch

from ...cache.many import advance_lockstep
from ...env import Env
from ...errors import CacheError, RequestError
from . import capture as cuda_capture
from .chunk_step import chunk_pass
from .decode_step import DecodeStep
from .step_weights import unsupported, unsupported_weights
from .chunk_graph import ChunkGraphs, auto_limit
from .triton_attn import layout
from .triton_decode import plane_row, splits_for


_KEYS = attrgetter("keys")                 # a plane's K storage (identity changes when it moves)


class _Entry:
    """One captured batch size: its input buffers, workspace, graph and output."""

    def __init__(self, step: DecodeStep, batch: int, n_layers: int, n_groups: int, device):
        self.batch = batch
        self.packed = torch.zeros(2 * batch + 2 * batch * n_groups, dtype=torch.int64, device=device)
        self.host = torch.zeros(self.packed.shape, dtype=torch.int64)
        if torch.device(device).type == "cuda":
            self.host = self.host.pin_memory()
        self.tables = torch.zeros((n_layers, batch, 4), dtype=torch.int64, device=device)
        # plane tables go up from two pinned buffers in turn, each freed by an event: a pageable
        # copy would make the host wait for the step in flight (a pipelined run's, greedy.py)
        cuda = torch.device(device).type == "cuda"
        self.tables_host = [torch.zeros(self.tables.shape, dtype=torch.int64) for _ in range(2)]
        if cuda:
            self.tables_host = [t.pin_memory() for t in self.tables_host]
        self.tables_done = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.tables_turn = 0
        self.ws = step.workspace(batch)
        self.graph = None
        self.logits = None
        self.host_np = self.host.numpy()
        self.table_key = None
        self.done = None                      # event after the last replay


class _SessionView:
    """A session's planes grouped as the runner groups them, and its plane-table rows."""

    def __init__(self, session, members, growing):
        self.planes = session.planes
        self.groups = [[self.planes[i] for i in m] for m in members]
        self.growing = [self.planes[i] for i in growing]
        self._keys, self._rows = None, None

    def state(self):
        return [g[0].bookmark() for g in self.groups]

    def restore(self, state) -> None:
        for group, mark in zip(self.groups, state):
            for p in group:
                p.rewind(mark)

    def table_rows(self) -> torch.Tensor:
        """[L, 4] int64 (triton_decode.plane_row per plane); rebuilt when a growing plane moved."""
        if self._rows is None or any(map(is_not, map(_KEYS, self.growing), self._keys)):
            self._keys = list(map(_KEYS, self.growing))
            self._rows = torch.tensor([plane_row(p) for p in self.planes], dtype=torch.int64)
        return self._rows


class GraphRunner:
    def __init__(self, engine, env: Env | None = None, capture: bool = True):
        why = unsupported(engine.spec) or unsupported_weights(engine.weights)
        if why:
            raise RequestError(f"CUDA decode step does not support this model: {why}")
        self.engine = engine
        env = env if env is not None else engine.env          # decode knobs (MUSER_GEMV, ...)
        probe = engine.new_session().planes
        keys, self.layer_group, self.members = [], [], []
        for i, p in enumerate(probe):
            key = ("growing",) if p.kind == "growing" else ("ring", p.capacity)
            if key not in keys:
                keys.append(key)
                self.members.append([])
            self.layer_group.append(keys.index(key))
            self.members[keys.index(key)].append(i)
        self.group_kinds = keys
        self.growing = [i for key, m in zip(keys, self.members) if key[0] == "growing" for i in m]
        layouts = [layout(p.kind == "growing", p.head_dim, env) for p in probe]
        splits = [splits_for(p.capacity, p.kind == "growing", lay["split"])
                  for p, lay in zip(probe, layouts)]
        caps = [0 if p.kind == "growing" else p.capacity for p in probe]
        self.step = DecodeStep(engine, self.layer_group, splits, len(keys), layouts, caps, env)
        # one session's chunk in one replay (MUSER_CHUNK_GRAPHS; the same bits)
        staged = env.graph_keys == "staged"
        rows = env.chunk_graph_rows or auto_limit(self.step, engine.config.chunk_size,
                                                  _memory(engine.device), staged)
        self.graphs = (ChunkGraphs(self.step, [p.window for p in probe], capture, staged, rows)
                       if env.chunk_graphs == "on" and self.step.invariant else None)
        self.capture = capture
        self.entries: dict[int, _Entry] = {}
        self.pool = None
        self._views = weakref.WeakKeyDictionary()    # session -> _SessionView
        self.stats = {"captures": 0, "capture_seconds": 0.0, "replays": 0, "eager": 0,
                      "table_uploads": 0}

    # ------------------------------------------------------------------ bookkeeping
    def _view(self, s) -> "_SessionView":
        view = self._views.get(s)
        if view is None:
            view = self._views[s] = _SessionView(s, self.members, self.growing)
        return view

    def _advance(self, view: "_SessionView", pos: int) -> list[int]:
        """Reserve position `pos` on every plane of the session; returns [slot, n] per group.

        A session's planes move together (every forward touches all of them, a failed one
        rolls all back), so each group advances in lockstep (`advance_lockstep`: the first
        plane's arithmetic, the others take its result; each plane on its own under a
        caller's checkpoint, which logs evictions).
        """
        out = []
        for planes in view.groups:
            rep = planes[0]
            if rep.end != pos:
                raise CacheError(f"layer {rep.layer}: session at {pos} but plane ends at {rep.end}")
            out.extend(advance_lockstep(planes, 1))
        return out

    # ------------------------------------------------------------------ step
    def chunk_pass(self, engine, sessions, chunks, all_logits: bool, pad: bool,
                   logits: bool = True) -> torch.Tensor:
        """A pass of chunks through this runner's step (chunk_step.py): rows bitwise the rows
        `decode` gives.  The caller (backends/step.forward) owns the transaction."""
        return chunk_pass(self.step, engine, sessions, chunks, all_logits, pad, logits,
                          self.graphs)

    def greedy(self, sessions, run):
        """A greedy run (backends/greedy.py) with step N+1 launched before step N is read back
        (cuda/greedy.py).  Inputs come checked (`Budget.check`)."""
        from .greedy import pipelined
        return pipelined(self, sessions, run)

    def decode(self, sessions, tokens: list[int]) -> torch.Tensor:
        """One decode step for every session: float32 logits [B, vocab] (a fresh tensor).
        Inputs come validated (`Engine.forward`: distinct sessions, one id each, in range)."""
        views = [self._view(s) for s in sessions]
        saved = [v.state() for v in views]
        try:
            positions = [s.position for s in sessions]
            metas = [self._advance(v, pos) for v, pos in zip(views, positions)]
            logits = self._run(views, tokens, positions, metas)
        except BaseException:
            for v, st in zip(views, saved):
                v.restore(st)
            raise
        for s, t in zip(sessions, tokens):
            s.tokens.append(t)
        return logits

    def _entry(self, B: int) -> _Entry:
        entry = self.entries.get(B)
        if entry is None:
            entry = self.entries[B] = _Entry(self.step, B, len(self.layer_group),
                                             len(self.group_kinds), self.engine.device)
        return entry

    def _upload_tables(self, entry: _Entry, views) -> None:
        """The sessions' plane-table rows into the entry, when they are not there already."""
        rows = [v.table_rows() for v in views]
        # The entry keeps the row tensors it uploaded (strong references), so identity
        # cannot be faked by a freed-and-reused address.
        if entry.table_key is None or any(a is not b for a, b in zip(rows, entry.table_key)):
            k = entry.tables_turn
            entry.tables_turn ^= 1
            if entry.tables_done[k] is not None:
                entry.tables_done[k].synchronize()       # its last upload has run
            torch.stack(rows, dim=1, out=entry.tables_host[k])
            entry.tables.copy_(entry.tables_host[k], non_blocking=True)
            if entry.tables_done[k] is not None:
                entry.tables_done[k].record()
            entry.table_key = rows
            self.stats["table_uploads"] += 1

    def _pool(self):
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def _run(self, views, tokens, positions, metas) -> torch.Tensor:
        entry = self._entry(len(views))
        # ids | positions | per group: (slot, n) for each row
        flat = list(tokens) + list(positions)
        for g in range(len(self.group_kinds)):
            for m in metas:
                flat.extend(m[2 * g: 2 * g + 2])
        if entry.done is not None:
            entry.done.synchronize()          # the last replay has read the pinned buffer
        entry.host_np[:] = flat
        self._upload_tables(entry, views)
        if not self.capture:
            self.stats["eager"] += 1
            out = self._step(entry)
        else:
            if entry.graph is None:
                self._capture(entry)
            entry.graph.replay()
            self.stats["replays"] += 1
            out = entry.logits.clone()
        if entry.packed.is_cuda:
            entry.done = entry.done or torch.cuda.Event()
            entry.done.record()
        return out

    def _step(self, entry: _Entry) -> torch.Tensor:
        """Upload (pinned -> device, inside the graph when captured), then the maths."""
        entry.packed.copy_(entry.host, non_blocking=True)
        return self.step.run(entry.packed, entry.tables, entry.ws)

    def _capture(self, entry: _Entry) -> None:
        """Warm up eagerly (compiles kernels; writes this step's rows, which the replay
        rewrites identically), then capture.  The caller replays for the real result."""
        entry.graph, entry.logits = self.captured(lambda: self._step(entry))

    def captured(self, fn):
        """capture.capture(fn) into the runner's pool, counted and timed in `stats`: every
        graph of its steps (this file's, cuda/greedy.py's) is captured through here."""
        t0 = time.perf_counter()
        out = cuda_capture.capture(fn, self._pool())   # looked up at call time: a stand-in
        # (tests/backends/test_greedy_pipeline_host.py) serves both kinds of step
        self.stats["captures"] += 1
        self.stats["capture_seconds"] += time.perf_counter() - t0
        return out


def _memory(device) -> int:
    """The GPU's memory in bytes (0 off CUDA: the interpreter's runs keep the 2,048-row buckets)."""
    dev = torch.device(device)
    return torch.cuda.get_device_properties(dev).total_memory if dev.type == "cuda" else 0


def make_runner(engine, env: Env | None = None):
    """A GraphRunner for a ring-family engine (the CUDA backend's), or None when it does not apply."""
    if (engine.config.backend != "ring" or unsupported(engine.spec)
            or unsupported_weights(engine.weights)):
        return None
    return GraphRunner(engine, env)
