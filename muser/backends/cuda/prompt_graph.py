"""Cold prompts on CUDA in one graph replay: a session's first chunk without ~10 launches a layer
from Python.

Owns: `PromptGraphs` -- per bucket of rows (64, 96, 128, ... 2,048) one captured pass of the
decode step's layer loop over static buffers: token ids in; every layer's q/k/v rows, its
attention output and the final hidden rows out.  A first chunk (position 0, empty planes)
attends over its own rows only, so nothing inside the graph reads a plane and no plane
pointer is baked into it.  After the replay the chunk's real rows go into the session's planes
through `Plane.store` (their own bookkeeping and undo logs: the caller's transaction holds),
and the head runs eagerly on the rows asked for.  Does not own: whether a pass qualifies
(`applies`; chunk_step.chunk_pass asks), the kernels, the transaction (backends/step.py).

Why: a 512-token prefill of the 270M shape is 2.6 ms of kernels and 15-21 ms of wall time on
the H200 (benchmarks/prefill_host_probe.py): the eager chunk pass is host-bound.

Why the bits are the eager pass's (one arithmetic per token, docs/exactness.md):

    eager pass   rows 0..R-1                      keys: the plane (in place / ring)
    this pass    rows 0..R-1 | pad R..Rb-1        keys: the chunk's own k/v buffer, rows = positions

the same launches with the same constants; the padding rows sit at positions past the last
real one, which no real row sees (causal), and a row's bits do not depend on its neighbours in
a tile; keys read from an ordered buffer are the same values folded in the same order as keys
read from a ring in place.  tests/cuda/test_prompt_graph.py holds the two passes equal.
"""
from __future__ import annotations

import torch

BUCKETS = (64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def bucket_for(rows: int) -> int | None:
    """The smallest bucket holding `rows` (None: longer than the largest)."""
    return next((b for b in BUCKETS if b >= rows), None)


class _Bucket:
    """One bucket's static buffers and, once captured, its graph and hidden-rows output."""

    def __init__(self, step, rows: int, device):
        spec, dt = step.spec, step.engine.dtype
        self.rows = rows
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.arange(rows, device=device)
        # per layer: k / v [Rb, KV, D] (row = position; kept until the stores after the replay);
        # q and the attention output [Rb, H, D] one buffer per head dim for every layer (a layer's
        # are read before the next layer writes them)
        self.k, self.v, self.tables = [], [], []
        by_dim = {ls.head_dim: torch.empty(2, rows, spec.num_heads, ls.head_dim, dtype=dt,
                                           device=device) for ls in spec.layers}
        self.q = [by_dim[ls.head_dim][0] for ls in spec.layers]
        self.out = [by_dim[ls.head_dim][1] for ls in spec.layers]
        for ls in spec.layers:
            KV, D = ls.kv_heads, ls.head_dim
            k = torch.empty(rows, KV, D, dtype=dt, device=device)
            self.k.append(k)
            self.v.append(torch.empty_like(k))
            # the decode launch's plane table, pointing at this bucket's k / v (triton_decode)
            self.tables.append(torch.tensor([[k.data_ptr(), self.v[-1].data_ptr(), KV * D, D]],
                                            dtype=torch.int64, device=device).expand(rows, 4)
                               .contiguous())
        # (slot, n) per row: row r stores at slot r and attends over nothing
        self.meta = torch.stack([self.pos, torch.zeros_like(self.pos)], 1).contiguous()
        self.graph = None
        self.hidden = None                 # [Rb, hidden]: the last pass's final-normed rows


class PromptGraphs:
    """Captured first-chunk passes of one DecodeStep (`capture=False`: the same static-buffer
    pass run eagerly -- the CPU tests under Triton's interpreter)."""

    def __init__(self, step, windows: list[int | None], capture: bool = True):
        self.step = step
        self.windows = windows             # per layer: the plane's window (None: unbounded)
        self.capture = capture
        self.buckets: dict[int, _Bucket] = {}
        self.pool = None
        self.failed: str | None = None     # why capturing failed (then every pass goes eager)
        self.stats = {"captures": 0, "replays": 0, "eager": 0}

    def applies(self, sessions, chunks) -> bool:
        """One session at position 0 (every plane empty), a chunk a bucket holds, a dense
        model whose layers each own a plane."""
        if self.failed or len(sessions) != 1 or not 0 < len(chunks[0]) <= BUCKETS[-1]:
            return False
        s = sessions[0]
        return (s.position == 0 and all(p.len == 0 for p in s.planes)
                and len(set(s.plane_of)) == len(s.plane_of)
                and self.step.spec.moe is None)

    def run(self, engine, session, chunk: list[int], all_logits: bool,
            logits: bool) -> torch.Tensor | None:
        """The chunk through its bucket's pass, its rows stored, logits as chunk_step returns
        (None: the capture failed -- nothing was stored; the caller takes the eager pass)."""
        R = len(chunk)
        b = self.buckets.get(bucket_for(R))
        if b is None:
            b = self.buckets[bucket_for(R)] = _Bucket(self.step, bucket_for(R), engine.device)
        b.ids[:R].copy_(torch.tensor(chunk, dtype=torch.long))
        if not self.capture:
            self.stats["eager"] += 1
            b.hidden = self._pass(b)
        else:
            if b.graph is None and not self._capture(b):
                return None
            b.graph.replay()
            self.stats["replays"] += 1
        for i, plane_index in enumerate(session.plane_of):
            session.planes[plane_index].store(0, b.k[i][:R], b.v[i][:R])
        if not logits:
            return torch.empty((0, self.step.spec.vocab_size), dtype=torch.float32,
                               device=engine.device)
        return self.step.head(b.hidden[:R] if all_logits else b.hidden[R - 1:R])

    def _pass(self, b: _Bucket) -> torch.Tensor:
        """The layer loop over the bucket's buffers (what the graph captures)."""
        from .triton_chunk import chunk_attention
        from .triton_decode import prepare_rows_into
        step, spec = self.step, self.step.spec

        def attend(i, lw, ls, qkv, qn, kn):
            cos, sin = step.rope[i]
            lay = step.lays[i]
            prepare_rows_into(qkv, b.pos, cos, sin, qn, kn, spec.norm_eps, spec.num_heads,
                              ls.kv_heads, ls.head_dim, step.splits[i], spec.rope_interleaved,
                              b.q[i], b.k[i], b.v[i], b.tables[i], b.meta, v_norm=spec.v_norm,
                              k_eq_v=lw.wv is None, capacity=step.caps[i], **lay)
            return chunk_attention(b.q[i], b.k[i], b.v[i], 0, 0, self.windows[i],
                                   spec.layer_scale(ls), spec.attn_logit_softcap,
                                   spec.rope_interleaved, lay, sinks=lw.sinks, out=b.out[i])

        return step.layers(b.ids, attend)

    def _capture(self, b: _Bucket) -> bool:
        """Warm up eagerly on a side stream (compiles the kernels; the planes are not touched),
        then capture.  A failure marks the whole object failed (`failed` says why): every pass
        goes eager from then on."""
        from .capture import capture
        try:
            if self.pool is None:
                self.pool = torch.cuda.graph_pool_handle()
            b.graph, b.hidden = capture(lambda: self._pass(b), self.pool)
        except RuntimeError as e:                     # a kernel or op capture does not take
            self.failed = f"{type(e).__name__}: {e}"[:300]
            torch.cuda.synchronize()
            return False
        self.stats["captures"] += 1
        return True
