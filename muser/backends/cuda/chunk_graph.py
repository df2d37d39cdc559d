"""One session's chunk on CUDA in one graph replay: a prompt, a later turn, a verification block,
without the ~19 launches a layer the eager chunk pass makes from Python.

Owns: `ChunkGraphs` -- per bucket of rows (2, 4, ... 2,048 padded; 3,072 ... 16,384 at their
exact length, `takes`, up to MUSER_CHUNK_GRAPH_ROWS, `auto_limit`) one captured pass of the decode
step's layer loop over static buffers.  Inputs go up as one packed upload that the graph itself
copies in (ids | positions | per layer the plane's table row | the attention view's | (start,
rows, first, rot or the shadow's first slot, capacity, key rows)); the chunk attention reads
by those device values (`chunk_attention(..., dev=)`), so one graph serves any session at any
position.  Where the keys are read (MUSER_GRAPH_KEYS, triton_graph_rows.py):

    staged (default)  one ordered view, as the eager pass reads: a plane that `writes_ahead`
                      (growing) takes the chunk's rows past its end in the graph, checked and
                      grown before the replay (`Plane.make_room`); a ring's history is gathered
                      into the bucket's shadow, the chunk's rows written right after it
    apart             the history in place (a ring by its wrapped slots), the chunk's own rows
                      from the bucket's k/v buffers (`new=`): scalar loads, 1-3 KB of spills

After the replay the chunk's real rows are committed through `cache.many.store_many` (their
bookkeeping and undo logs: the caller's transaction and a speculative round's checkpoint hold;
rows already placed are not copied again), and the head runs eagerly on the rows asked for.
Does not own: whether a pass qualifies (`applies`; chunk_step.chunk_pass
asks), the kernels, the transaction (backends/step.py).

Why: a 512-token prefill of the 270M shape is 2.6 ms of kernels in 15-21 ms of wall time on the
H200 (benchmarks/prefill_host_probe.py); a verification block is the same host work.

Why the bits are the eager pass's (one arithmetic per token, docs/exactness.md):

    eager pass   rows 0..R-1                  keys: a staged view (in place / shadow / ring)
    this pass    rows 0..R-1 | pad ..Rb-1     keys: one ordered view (staged) or two (apart)

the same launches with the same constants; the padding rows (positions past the last real one,
RoPE'd at the last real position) are not rows any real row sees, and the kernel's row count
is the real one (a padding row is never placed in a plane); a row's bits do not depend on its
neighbours in a tile; keys read by position from any of these views are the same values folded
in the same order.
tests/cuda/test_chunk_graph.py holds the two passes equal.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence

import torch

from ...cache.many import store_many
from .triton_decode import plane_row, prepare_tables
from .triton_graph_rows import fill_shadow, place_rows

BUCKETS = (2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
           3072, 4096, 6144, 8192, 12288, 16384)
PADDED = 2048     # chunks up to this many rows take their bucket padded; longer ones exact only


def bucket_for(rows: int, limit: int = BUCKETS[-1]) -> int | None:
    """The smallest bucket holding `rows`, if it is at most `limit` rows (None: no bucket)."""
    return next((b for b in BUCKETS if rows <= b <= limit), None)


def takes(rows: int, limit: int) -> bool:
    """Whether a chunk of `rows` goes through a graph: up to PADDED rows in its bucket, padded;
    past that only a chunk of exactly a bucket's rows (up to `limit`: a long prompt's full
    prefill chunks) -- a padded row costs every projection a row's work, which at thousands of
    rows is GPU time, not host time, and pieces lose too (H200, the 1B's 9,000-token prefill as
    8,192 + 808 in graphs: 235-237k tok/s against 244-248k for one eager pass)."""
    return 0 < rows <= min(PADDED, limit) or (rows > PADDED and rows <= limit and rows in BUCKETS)


def bucket_bytes(step, rows: int, staged: bool = True) -> int:
    """What one bucket of `rows` keeps allocated (_Bucket: per layer the chunk's k / v -- a
    staged ring's are the tail of its shadow, capacity + rows -- and q / out per head dim), the
    graph pool aside."""
    spec, el = step.spec, torch.empty(0, dtype=step.engine.dtype).element_size()
    n = 2 * rows * spec.num_heads * sum({ls.head_dim for ls in spec.layers})
    for ls, cap in zip(spec.layers, step.caps):
        n += 2 * ls.kv_heads * ls.head_dim * (cap + rows if staged and cap else rows)
    return n * el


def auto_limit(step, chunk_size: int, memory: int, staged: bool = True) -> int:
    """MUSER_CHUNK_GRAPH_ROWS=auto: the largest bucket up to the prefill chunk whose buffers take
    at most 1/64 of the GPU's `memory` (bytes), PADDED at least (the 1B shape on an H200: 16,384
    rows, ~0.9 GB; a 27B's rows are ~10x larger: ~4,096 there, 2,048 on 80 GB)."""
    fit = [b for b in BUCKETS if PADDED <= b <= max(chunk_size, PADDED)
           and bucket_bytes(step, b, staged) <= memory // 64]
    return max(fit, default=PADDED)


def fill_host(host: torch.Tensor, chunk, start: int, rows: int, tables: list[int]) -> None:
    """The bucket's upload: ids | positions | `tables` (int64 [2 * rows + len(tables)]), filled
    without a Python loop over the rows (a 16k chunk's list took ~2 ms).

        ids        chunk[0..R) | 0 ...                       (padding rows: token 0)
        positions  start .. start + R - 1 | start + R - 1 ...  (padding at the last real one)
    """
    R = len(chunk)
    ids, pos = host[:rows], host[rows:2 * rows]
    ids[:R] = torch.frombuffer(array("q", chunk), dtype=torch.int64)
    ids[R:] = 0
    torch.arange(start, start + rows, out=pos)
    pos.clamp_(max=start + R - 1)
    host[2 * rows:] = torch.tensor(tables, dtype=torch.int64)


class _Bucket:
    """One bucket's static buffers and, once captured, its graph and hidden-rows output.
    `shadows[i]`: layer i's ring gathers its history into an ordered shadow (staged keys)."""

    def __init__(self, step, rows: int, device, shadows: list[bool]):
        spec, dt = step.spec, step.engine.dtype
        L = len(spec.layers)
        self.rows = rows
        # ids [Rb] | pos [Rb] | plane tables [L, 4] | view tables [L, 4] | metas [L, 6], uploaded
        # as one copy (a view table: what the attention reads -- the plane, or a ring's shadow)
        self.host = torch.zeros(2 * rows + 14 * L, dtype=torch.int64)
        if torch.device(device).type == "cuda":
            self.host = self.host.pin_memory()
        self.packed = torch.zeros(self.host.shape, dtype=torch.int64, device=device)
        self.ids, self.pos = self.packed[:rows], self.packed[rows:2 * rows]
        self.tab = self.packed[2 * rows:2 * rows + 4 * L].view(L, 4)
        self.vtab = self.packed[2 * rows + 4 * L:2 * rows + 8 * L].view(L, 4)
        self.meta = self.packed[2 * rows + 8 * L:].view(L, 6)
        # per layer: the chunk's k / v [Rb, KV, D] (kept until the stores after the replay); q
        # and the attention output [Rb, H, D] one buffer per head dim (read before the next
        # layer writes them)
        self.k, self.v, self.prep = [], [], []        # prep: prepare_rows_into's tables
        by_dim = {ls.head_dim: torch.zeros(2, rows, spec.num_heads, ls.head_dim, dtype=dt,
                                           device=device) for ls in spec.layers}
        self.q = [by_dim[ls.head_dim][0] for ls in spec.layers]
        self.out = [by_dim[ls.head_dim][1] for ls in spec.layers]
        # a shadowed ring's keys: [cap + Rb, KV, D] = positions start - cap .. start - 1 | the
        # chunk's rows (self.k[i] is the tail: prepare_rows writes the rows in place)
        self.sk, self.sv = [None] * L, [None] * L
        for i, (ls, cap) in enumerate(zip(spec.layers, step.caps)):
            KV, D = ls.kv_heads, ls.head_dim
            if shadows[i]:
                self.sk[i] = torch.zeros(cap + rows, KV, D, dtype=dt, device=device)
                self.sv[i] = torch.zeros_like(self.sk[i])
                k, v = self.sk[i][cap:], self.sv[i][cap:]
            else:
                k = torch.empty(rows, KV, D, dtype=dt, device=device)
                v = torch.empty_like(k)
            self.k.append(k)
            self.v.append(v)
            self.prep.append(prepare_tables(k, v))
        self.graph = None
        self.graph_done = None             # an event after the last replay (it read `host`)
        self.hidden = None                 # [Rb, hidden]: the last pass's final-normed rows


class ChunkGraphs:
    """Captured single-session chunk passes of one DecodeStep (`capture=False`: the same
    static-buffer pass run eagerly -- the CPU tests under Triton's interpreter)."""

    def __init__(self, step, windows: list[int | None], capture: bool = True,
                 staged: bool = True, max_rows: int = 2048):
        self.step = step
        # MUSER_CHUNK_GRAPH_ROWS: the largest bucket used -- each bucket keeps its buffers and
        # its share of the graph pool once captured, so long buckets are memory traded for the
        # eager pass's ~19 launches a layer from Python (the 16k prefill's ~4 ms of host start
        # and early gaps on the 1B shape)
        self._set_limit(max((b for b in BUCKETS if b <= max_rows), default=0))
        self.windows = windows             # per layer: the plane's window (None: unbounded)
        self.capture = capture
        # MUSER_GRAPH_KEYS: staged -- every layer's keys in one ordered view (a plane that
        # `writes_ahead` takes the chunk's rows past its end first, a ring gathers a shadow);
        # apart -- the history in place and the chunk's own rows from the bucket's buffers
        self.staged = staged
        self.buckets: dict[int, _Bucket] = {}
        self.pool = None
        self.failed: str | None = None     # why capturing failed (then every pass goes eager)
        self.stats = {"captures": 0, "replays": 0, "eager": 0, "no_room": 0}

    def _set_limit(self, limit: int) -> None:
        """The largest bucket used; the step learns which long row counts run as graphs (its
        DecodeStep.graph_rows: TMA for every weight there)."""
        self.limit = limit
        self.step.graph_rows = frozenset(b for b in BUCKETS if PADDED < b <= limit)

    def _no_room(self, rows: int) -> None:
        """A bucket the GPU had no memory for (its buffers or its capture): it and every longer
        bucket go eager from now on; the shorter ones keep their graphs.  Nothing was stored."""
        self.buckets.pop(rows, None)
        self._set_limit(max((b for b in BUCKETS if b < rows and b <= self.limit), default=0))
        self.stats["no_room"] += 1
        if torch.cuda.is_available():
            torch.cuda.empty_cache()              # the half-built bucket's blocks back to the GPU

    def applies(self, sessions, chunks) -> bool:
        """One session, a chunk a bucket holds, a dense model whose layers each own a plane."""
        if self.failed or len(sessions) != 1 or not takes(len(chunks[0]), self.limit):
            return False
        s = sessions[0]
        return len(set(s.plane_of)) == len(s.plane_of) and self.step.spec.moe is None

    def run(self, engine, session, chunk: Sequence[int], all_logits: bool,
            logits: bool) -> torch.Tensor | None:
        """The chunk through its bucket's pass, its rows stored, logits as chunk_step returns
        (None: the capture failed -- nothing was stored; the caller takes the eager pass)."""
        R, start = len(chunk), session.position
        rows = bucket_for(R, self.limit)
        planes = [session.planes[i] for i in session.plane_of]
        # the stores' checks before the replay (nothing moves; a growing plane grows): staged,
        # a plane that `writes_ahead` takes the chunk's rows past its end inside the graph
        for p in planes:
            p.make_room(start, R)
        placed = [self.staged and p.writes_ahead for p in planes]
        b = self.buckets.get(rows)
        if b is None:
            shadows = [self.staged and not p.writes_ahead for p in planes]
            try:
                b = _Bucket(self.step, rows, engine.device, shadows)
            except torch.OutOfMemoryError:
                self._no_room(rows)
                return None
            self.buckets[rows] = b
        tabs = [plane_row(p) for p in planes]
        flat = [x for t in tabs for x in t]
        for t, p, sk, sv in zip(tabs, planes, b.sk, b.sv):
            if sk is None:
                flat += t
            else:                       # the shadow from the live history's first row on
                skip = (p.capacity - p.len) * sk.stride(0) * sk.element_size()
                flat += [sk.data_ptr() + skip, sv.data_ptr() + skip, sk.stride(0), sk.stride(1)]
        for p, ahead, sk in zip(planes, placed, b.sk):
            if ahead:                   # the history, then the chunk's rows placed after it
                flat += [start, R, p.origin_logical, 0, 0, p.len + R]
            elif sk is not None:        # gathered from slot(start) on; read as the eager shadow
                flat += [start, R, p.origin_logical, p.slot(start), p.capacity, p.len + R]
            else:
                flat += [start, R, p.origin_logical, p.origin_physical,
                         p.capacity if p.kind == "ring" else 0, p.len]
        if b.graph_done is not None:
            b.graph_done.synchronize()         # the last replay has read the pinned buffer
        fill_host(b.host, chunk, start, rows, flat)
        if not self.capture:
            self.stats["eager"] += 1
            b.hidden = self._pass(b)
        else:
            if b.graph is None and not self._capture(b):
                return None
            b.graph.replay()
            b.graph_done = b.graph_done or torch.cuda.Event()
            b.graph_done.record()
            self.stats["replays"] += 1
        # the rows, their undo logs and bookkeeping, every plane's at once (a few copies)
        store_many(planes, start, [k[:R] for k in b.k], [v[:R] for v in b.v], placed)
        if not logits:
            return torch.empty((0, self.step.spec.vocab_size), dtype=torch.float32,
                               device=engine.device)
        return self.step.head(b.hidden[:R] if all_logits else b.hidden[R - 1:R])

    def _pass(self, b: _Bucket) -> torch.Tensor:
        """Upload, then the layer loop over the bucket's buffers (what the graph captures)."""
        from .triton_chunk import chunk_attention
        from .triton_decode import prepare_rows_into
        step, spec = self.step, self.step.spec
        b.packed.copy_(b.host, non_blocking=True)

        def attend(i, lw, ls, qkv, qn, kn):
            cos, sin = step.rope[i]
            lay, cap = step.lays[i], step.caps[i]
            prepare_rows_into(qkv, b.pos, cos, sin, qn, kn, spec.norm_eps, spec.num_heads,
                              ls.kv_heads, ls.head_dim, step.splits[i], spec.rope_interleaved,
                              b.q[i], b.k[i], b.v[i], *b.prep[i], v_norm=spec.v_norm,
                              k_eq_v=lw.wv is None, capacity=cap, **lay)
            # (the view args only carry dtype and strides here: TAB / META say where to read)
            ring, new = ((0, cap) if cap else None), (b.k[i], b.v[i])
            if b.sk[i] is not None:                    # a ring's history, ordered
                fill_shadow(b.tab[i], b.meta[i], b.sk[i], b.sv[i], cap)
                ring, new = None, None
            elif self.staged:                          # the rows past the plane's end
                place_rows(b.k[i], b.v[i], b.tab[i], b.meta[i])
                ring, new = None, None
            return chunk_attention(b.q[i], b.k[i], b.v[i], 0, 0, self.windows[i],
                                   spec.layer_scale(ls), spec.attn_logit_softcap,
                                   spec.rope_interleaved, lay, sinks=lw.sinks, out=b.out[i],
                                   ring=ring, new=new, dev=(b.vtab[i], b.meta[i]),
                                   positions=self.step.engine.max_context)

        return step.layers(b.ids, attend)

    def _capture(self, b: _Bucket) -> bool:
        """Warm up eagerly, then capture (capture.py).  The warm-up writes only the bucket's own
        buffers.  Out of memory: this bucket and the longer ones go eager (`_no_room`); any
        other failure marks the whole object failed (`failed` says why): every pass goes eager
        from then on."""
        from .capture import capture
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            b.graph, b.hidden = capture(lambda: self._pass(b), self.pool)
        except torch.OutOfMemoryError:
            torch.cuda.synchronize()
            self._no_room(b.rows)
            return False
        except RuntimeError as e:                     # a kernel or op capture does not take
            self.failed = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()
            return False
        self.stats["captures"] += 1
        return True
