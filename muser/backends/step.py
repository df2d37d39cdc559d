"""The one forward: 1..B sessions x 1..k rows each, through every layer, transactional.

Owns: `forward(engine, sessions, chunks, all_logits, pad)`.  A decode step
(one session, one row, no padding), a verification block or a prefill chunk
(one session, k rows, padded) and a batched decode step (B sessions, one row
each) are this one call with different shapes; every backend's step driver
runs it (CUDA's graph runner takes the decode shapes itself and hands it the
rest).  Does not own: the maths (muser.model.transformer with the backend's
ops table), attention arithmetic (the backend's), plane layouts or the
attend-before-overwrite routes (muser.cache.staging), validation of the ids
(Engine.forward).

Shapes.  Session b brings `real[b]` tokens at positions [start_b, start_b + real[b]).
Chunks carry scratch rows up to a multiple of PAD_ROWS (`pad`): row results of
a matmul can depend on its row count (BLAS picks kernels by shape), and with
the padding a block later rolled back to `keep` tokens left exactly the rows a
`keep`-token extend would have left.  Scratch rows are attended by nobody real
(they are in the future) and never appended.  A decode row is not padded: it is
its own shape.  When every row-wise op of the backend is row-invariant at this
size (padded rows <= `backend.invariant_rows`), only attention sees the padded
shape: the matmuls run on the real rows and the scratch rows enter attention
as zeros.  When every op is, attention included (`backend.exact_rows`: the CPU
int8 path, whose attention reads keys by absolute position), a row's bits
depend on nothing but its token's history -- not on the chunk's size,
alignment or neighbours -- so there is nothing for scratch rows to pin and
chunks are not padded at all.

Sessions share a pass -- their matmul rows stacked, [sum rows, hidden];
attention per session over its own planes at its own positions -- only while
the pass stays within `backend.invariant_rows` (a row then does not depend on
its neighbours, nor on how many there are): consecutive sessions are grouped up
to that many padded rows, one pass per group.  A backend without row-invariant
matmuls (0) gives each session its own pass.

KV-shared layers (Gemma 4: `LayerSpec.kv_source`) own no plane: each layer attends over
`session.planes[session.plane_of[layer]]`, and a shared layer (k = v = None) over its
source layer's staged chunk, which `SharedStages` keeps uncommitted until the last
reader has attended.  Each layer attends with its own softmax scale and sinks.

Transactions: every session's forward runs inside a checkpoint unless its
caller already opened one; if anything raises half-way through the layers (a
bad kernel, an OOM, an injected fault) every session's stored rows are rolled
back with keep=0 and its lineage is untouched.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention.reference import visibility_mask
from ..cache import Checkpoint, last_readers, stage
from ..model import transformer as tf

PAD_ROWS = 16   # chunk row counts are rounded up to this


def forward(engine, sessions: list, chunks: list[Sequence[int]], all_logits: bool, pad: bool,
            logits: bool = True, pass_fn=None) -> torch.Tensor:
    """float32 logits: [sum of chunk lengths, vocab] with `all_logits`, else [B, vocab] (each
    session's last row); [0, vocab] without `logits` (a prefill chunk that is not the last one:
    the final norm and the head are skipped, the planes are the same).  Appends every chunk to its
    session's planes and lineage.  `pass_fn` (default: the eager `_pass` below) computes one
    pass of a group of sessions; CUDA's exact chunks bring their own (cuda/chunk_step.py)."""
    pass_fn = pass_fn or _pass
    guards = [Checkpoint(s.planes, s.position, len(c)) if s._open is None else None
              for s, c in zip(sessions, chunks)]
    try:
        if len(sessions) == 1:
            out = pass_fn(engine, sessions, chunks, all_logits, pad, logits)
        else:
            parts = [pass_fn(engine, sessions[a:b], chunks[a:b], all_logits, pad, logits)
                     for a, b in _groups(chunks, pad and not engine.backend.exact_rows,
                                         engine.backend.invariant_rows)]
            out = parts[0] if len(parts) == 1 else torch.cat(parts)
    except BaseException:
        for g in guards:
            if g is not None and g.open:
                g.rollback(0)
        raise
    for s, g, c in zip(sessions, guards, chunks):
        if g is not None:
            g.commit()
        s.tokens.extend(c)
    return out


def _pass(engine, sessions, chunks, all_logits: bool, pad: bool, logits: bool = True) -> torch.Tensor:
    """One pass of the stacked rows of `sessions` through every layer (no transaction)."""
    spec, weights, backend, dev = engine.spec, engine.weights, engine.backend, engine.device
    B = len(sessions)
    starts = [s.position for s in sessions]
    real = [len(c) for c in chunks]
    padded = [_padded(t) for t in real] if pad and not backend.exact_rows else real
    # rows the matmuls see: the real ones when every row-wise op is row-invariant at this size
    rows = real if padded is real or sum(padded) <= backend.invariant_rows else padded
    ids = []
    for c, t, r in zip(chunks, real, rows):
        ids.extend(c)
        if r > t:
            ids.extend([0] * (r - t))
    ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
    # positions of every padded row, session after session: [sum padded]
    if B == 1:
        att_pos = torch.arange(starts[0], starts[0] + padded[0], device=dev)
    elif all(p == 1 for p in padded):
        att_pos = torch.tensor(starts, dtype=torch.long, device=dev)
    else:
        att_pos = torch.cat([torch.arange(s, s + p, device=dev) for s, p in zip(starts, padded)])
    att_off, mm_off = row_offsets(padded), row_offsets(rows)
    if rows is padded:
        mm_pos = att_pos
    elif B == 1:
        mm_pos = att_pos[:rows[0]]
    else:
        mm_pos = torch.cat([att_pos[a:a + r] for a, r in zip(att_off, rows)])
    attention = backend.attention
    positional = getattr(attention, "positional", None)       # CPU: keys by absolute position
    banded = getattr(attention, "banded", None)               # CUDA: the window as a band
    ops = backend.ops
    shared = [SharedStages(spec) for _ in sessions]

    def attend_one(plane, b, ls, lw, q, k, v):           # q [rows_b, H, D], k/v [rows_b, KV, D] or None
        n, t_pad, start = q.shape[0], padded[b], starts[b]
        if n < t_pad:                                    # compact chunk: scratch rows enter as zeros
            q, k, v = (None if x is None else torch.cat([x, x.new_zeros((t_pad - n, *x.shape[1:]))])
                       for x in (q, k, v))
        staged = shared[b].take(ls) if k is None else stage(plane, start, k, v, real[b])
        scale, softcap, sinks = spec.layer_scale(ls), spec.attn_logit_softcap, lw.sinks
        if positional is not None:
            out = _attend_positional(positional, plane, staged, q, start, scale, softcap, sinks)
        elif staged.needs_mask and staged.ordered and banded is not None:
            # CUDA: the window rule as positions (flash attention, no dense mask)
            out = banded(q, staged.keys, staged.values, start, staged.first_position,
                         plane.window, scale, softcap, sinks)
        else:
            mask = None
            if staged.needs_mask:
                pos = att_pos if B == 1 else att_pos[att_off[b]:att_off[b] + t_pad]
                mask = visibility_mask(pos, staged.key_positions(), plane.window)
            if sinks is None:
                out = attention(q, staged.keys, staged.values, mask, scale, softcap)
            else:
                out = attention(q, staged.keys, staged.values, mask, scale, softcap, sinks=sinks)
        shared[b].done(ls, staged)                       # attend before overwrite (after shared readers)
        return out[:n]

    def attend_for(li, ls, lw):
        if B == 1:
            s0 = sessions[0]
            plane = s0.planes[s0.plane_of[li]]
            return lambda q, k, v: attend_one(plane, 0, ls, lw, q, k, v)
        planes = [s.planes[s.plane_of[li]] for s in sessions]

        def attend(q, k, v):                             # q [sum rows, H, D], k/v [sum rows, KV, D] or None
            return torch.cat([attend_one(planes[b], b, ls, lw, q[o:o + r], None if k is None else k[o:o + r],
                                         None if v is None else v[o:o + r])
                              for b, (o, r) in enumerate(zip(mm_off, rows))])
        return attend

    h = tf.embed(weights, spec, ids_t)                   # [sum rows, hidden]
    ple = tf.per_layer_inputs(weights, spec, ids_t, h, ops)   # Gemma 4: [sum rows, L, P]
    memo: dict = {}
    for li, (layer_spec, lw) in enumerate(zip(spec.layers, weights.layers)):
        h = tf.layer_forward(lw, spec, layer_spec, h, mm_pos, attend_for(li, layer_spec, lw), memo, ops,
                             None if ple is None else ple[:, li])
    if not logits:
        return torch.empty((0, spec.vocab_size), dtype=torch.float32, device=h.device)
    h = _keep_rows(h, real, rows, mm_off, all_logits)
    return tf.logits(weights, spec, tf.final_hidden(weights, spec, h, ops))


def _attend_positional(positional, plane, staged, q, start: int, scale: float, softcap: float | None,
                       sinks=None) -> torch.Tensor:
    """Attention of q [T, H, D] (positions start ..) over a staged chunk, keys read by position:
    an ordered view (in place, shadow) from its first position, or the ring in place (ring
    decode) through its origins.  Sinks (gpt-oss) join the kernel's merge."""
    if staged.ordered:
        keys, values, pos0, rot, count = staged.keys, staged.values, staged.first_position, 0, staged.keys.shape[0]
    else:
        keys, values = plane.keys, plane.values
        pos0, rot, count = plane.origin_logical, plane.origin_physical, plane.len
    if sinks is None:
        return positional(q, start, plane.window, keys, values, pos0, count, rot, scale, softcap)
    return positional(q, start, plane.window, keys, values, pos0, count, rot, scale, softcap, sinks=sinks)


class SharedStages:
    """One pass's staged chunks (of one session) that KV-shared layers still have to read.

    A layer whose plane later layers read (Gemma 4's KV sharing) keeps its staged chunk
    -- the key/value view its queries attended -- uncommitted until its last reader has
    attended over the same view: on a full ring the commit overwrites rows the readers'
    earliest queries still see.  Every other layer commits as soon as it has attended."""

    def __init__(self, spec):
        self.last = last_readers(spec.layers)
        self.pending: dict[int, object] = {}

    def take(self, ls):
        return self.pending[ls.kv_source]

    def done(self, ls, staged) -> None:
        if ls.kv_source is None:
            if ls.index in self.last:
                self.pending[ls.index] = staged
            else:
                staged.commit()
        elif self.last[ls.kv_source] == ls.index:
            self.pending.pop(ls.kv_source).commit()


def _padded(t: int) -> int:
    return -(-t // PAD_ROWS) * PAD_ROWS


def _groups(chunks, pad: bool, limit: int) -> list[tuple[int, int]]:
    """[a, b) ranges of consecutive sessions sharing one pass: at most `limit` padded rows each
    (a session over the limit, or any session when limit is 0, alone)."""
    out, a, total = [], 0, 0
    for i, c in enumerate(chunks):
        n = _padded(len(c)) if pad else len(c)               # an upper bound of its rows
        if i > a and total + n > limit:
            out.append((a, i))
            a, total = i, 0
        total += n
    out.append((a, len(chunks)))
    return out


def row_offsets(counts: list[int]) -> list[int]:
    out, at = [], 0
    for c in counts:
        out.append(at)
        at += c
    return out


def _keep_rows(h: torch.Tensor, real, rows, offsets, all_logits: bool) -> torch.Tensor:
    """The rows the logits are wanted for: every real row, or each session's last one."""
    if len(real) == 1:
        t = real[0]
        return h[:t] if all_logits else h[t - 1:t]
    if all(t == 1 for t in real) and all(r == 1 for r in rows):
        return h                                         # a batched decode step: one row each
    if all_logits:
        return torch.cat([h[o:o + t] for o, t in zip(offsets, real)])
    return torch.cat([h[o + t - 1:o + t] for o, t in zip(offsets, real)])
