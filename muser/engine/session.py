"""A session: one conversation's cache and the forward passes that fill it.

Owns: `Session` -- prefill / decode / extend, snapshot / restore, speculative
checkpoints, and the transactional guarantee that a failed forward leaves the
cache exactly as it was.  Does not own: the transformer maths
(muser.model.transformer), plane layouts (muser.cache) or sampling.

Every forward runs inside a checkpoint unless the caller already opened one:
if anything raises half-way through the layers (a bad kernel, an OOM, an
injected fault), the rows already stored are rolled back with `keep=0`.
"""
from __future__ import annotations

import torch

from ..attention.reference import visibility_mask
from ..cache import Checkpoint, build_planes, stage
from ..cache import snapshot as cut
from ..errors import CacheOverflow, CheckpointError, RequestError
from ..model import transformer as tf

PAD_ROWS = 16   # chunk row counts are rounded up to this (see Session._forward)


def attend_positional(positional, plane, staged, q, start: int, spec):
    """Attention of q [T, H, D] (positions start ..) over a staged chunk, keys read by position
    (CPU native kernel): an ordered view (in place, shadow) from its first position, or the
    ring in place (ring decode) through its origins."""
    if staged.ordered:
        keys, values, pos0, rot, count = staged.keys, staged.values, staged.first_position, 0, staged.keys.shape[0]
    else:
        keys, values = plane.keys, plane.values
        pos0, rot, count = plane.origin_logical, plane.origin_physical, plane.len
    return positional(q, start, plane.window, keys, values, pos0, count, rot, spec.scale, spec.attn_logit_softcap)


class Session:
    def __init__(self, engine):
        self.engine = engine
        spec = engine.spec
        self.planes = build_planes(spec.layers, engine.config.backend, engine.max_context,
                                   spec.num_kv_heads, spec.head_dim, engine.cache_dtype, engine.device)
        self.tokens: list[int] = []          # ids consumed, in order (the lineage)
        self._open: Checkpoint | None = None  # a caller's speculative checkpoint

    # ------------------------------------------------------------------ state
    @property
    def position(self) -> int:
        return self.planes[0].end if self.planes else len(self.tokens)

    def reset(self) -> None:
        for p in self.planes:
            p.reset()
        self.tokens = []
        self._open = None

    def check_invariants(self) -> None:
        ends = {p.end for p in self.planes}
        if len(ends) > 1 or (ends and ends.pop() != len(self.tokens)):
            raise CheckpointError(f"planes disagree on the position or the lineage: "
                                  f"{sorted(p.end for p in self.planes)} vs {len(self.tokens)} tokens")
        for p in self.planes:
            p.check_invariants()

    # ------------------------------------------------------------------ forward
    def _validate(self, ids) -> list[int]:
        ids = [int(i) for i in ids]
        if not ids:
            raise RequestError("expected at least one token id, got none")
        vocab = self.engine.spec.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise RequestError(f"token ids must be in [0, {vocab}), got {bad[:5]}")
        if self.position + len(ids) > self.engine.max_context:
            raise CacheOverflow(-1, self.engine.max_context, self.position + len(ids))
        return ids

    def _forward(self, ids: list[int], all_logits: bool, pad: bool = True) -> torch.Tensor:
        """Run one chunk through every layer; store its rows; return float32 logits.

        Chunks (prefill, extend) are padded with scratch rows to a multiple of
        PAD_ROWS, so every matmul of a chunk has the same row count whether it
        carries 3 real tokens or 11.  Row results of a matmul can depend on its
        row count (BLAS picks kernels by shape); with the padding, a block that
        is later rolled back to `keep` tokens left exactly the rows a `keep`-token
        extend would have left.  Scratch rows are attended by nobody real
        (they are in the future) and never appended.  Decode (one token) is not
        padded: it is its own shape.  When the row-wise ops are row-invariant
        (`engine.compact_chunk`), only the attention needs the padded shape: the
        rest runs on the real rows and the scratch rows enter attention as zeros.
        When every op is (`engine.exact_rows`: the CPU int8 path, whose attention
        reads keys by absolute position), a row's bits depend on nothing but its
        token's history -- not on the chunk's size, alignment or neighbours -- so
        there is nothing for scratch rows to pin and chunks are not padded at all.
        """
        engine, spec = self.engine, self.engine.spec
        start, t = self.position, len(ids)
        t_pad = -(-t // PAD_ROWS) * PAD_ROWS if pad and not engine.exact_rows else t
        rows = t if engine.compact_chunk(t_pad) else t_pad          # rows the matmuls see
        guard = Checkpoint(self.planes, start, t) if self._open is None else None
        try:
            ids_t = torch.tensor(ids + [0] * (rows - t), dtype=torch.long, device=engine.device)
            positions = torch.arange(start, start + t_pad, device=engine.device)
            h = tf.embed(engine.weights, spec, ids_t)
            memo: dict = {}
            for plane, layer_spec, lw in zip(self.planes, spec.layers, engine.weights.layers):
                h = tf.layer_forward(lw, spec, layer_spec, h, positions[:rows],
                                     self._attend_fn(plane, start, positions, t), memo)
            h = h[:t] if all_logits else h[t - 1:t]
            logits = tf.logits(engine.weights, spec, tf.final_hidden(engine.weights, spec, h))
        except BaseException:
            if guard is not None:
                guard.rollback(0)
            raise
        if guard is not None:
            guard.commit()
        self.tokens.extend(ids)
        return logits

    def _attend_fn(self, plane, start, positions, real):
        engine = self.engine

        def attend(q, k, v):                     # q [T, H, D], k/v [T, KV, D]
            n, t_pad = q.shape[0], positions.shape[0]
            if n < t_pad:                        # compact chunk: scratch rows enter as zeros
                q, k, v = (torch.cat([x, x.new_zeros((t_pad - n, *x.shape[1:]))]) for x in (q, k, v))
            return _attend(q, k, v)[:n]

        def _attend(q, k, v):
            staged = stage(plane, start, k, v, real)
            positional = engine.positional_attention
            if positional is not None:
                out = attend_positional(positional, plane, staged, q, start, engine.spec)
                staged.commit()
                return out
            mask = None
            banded = getattr(engine.attention, "banded", None)
            if staged.needs_mask and staged.ordered and banded is not None:
                # CUDA: the window rule as positions (flash attention, no dense mask)
                out = banded(q, staged.keys, staged.values, start, staged.first_position,
                             plane.window, engine.spec.scale, engine.spec.attn_logit_softcap)
                staged.commit()
                return out
            if staged.needs_mask:
                mask = visibility_mask(positions, staged.key_positions(), plane.window)
            out = engine.attention(q, staged.keys, staged.values, mask,
                                   engine.spec.scale, engine.spec.attn_logit_softcap)
            staged.commit()                      # attend before overwrite
            return out
        return attend

    def prefill(self, ids, chunk_size: int | None = None) -> torch.Tensor:
        """Consume `ids`; return float32 logits [vocab] of the last position."""
        ids = self._validate(ids)
        chunk = chunk_size or self.engine.config.chunk_size
        if chunk < 1:
            raise RequestError(f"chunk_size must be >= 1, got {chunk}")
        logits = None
        for i in range(0, len(ids), chunk):
            logits = self._forward(ids[i:i + chunk], all_logits=False)
        return logits[-1]

    def decode(self, token_id: int) -> torch.Tensor:
        """Consume one token; return float32 logits [vocab] for the next one."""
        runner = self.engine.decode_runner()
        if runner is not None:               # CUDA: one graph replay (engine/cuda_graph.py)
            return runner.decode([self], [token_id])[0]
        return self._forward(self._validate([token_id]), all_logits=False, pad=False)[-1]

    def extend(self, ids) -> torch.Tensor:
        """Consume `ids` in one chunk; return float32 logits [len(ids), vocab] (verification)."""
        return self._forward(self._validate(ids), all_logits=True)

    # ------------------------------------------------------------------ cuts
    def snapshot(self) -> cut.SessionSnapshot:
        return cut.take(self.planes, self.position, self.engine.encoding,
                        tokens=tuple(self.tokens), model=self.engine.fingerprint)

    def install(self, snap: cut.SessionSnapshot) -> None:
        """Replace this session's cache with `snap` (gated; nothing changes on refusal)."""
        if self._open is not None:
            raise CheckpointError("cannot restore into a session with an open checkpoint")
        self.engine.check_snapshot_model(snap)
        cut.install(snap, self.planes, self.engine.encoding)
        self.tokens = list(snap.tokens) if snap.tokens else [-1] * snap.position

    # ------------------------------------------------------------------ speculation
    def checkpoint(self, token_count: int) -> Checkpoint:
        if self._open is not None:
            raise CheckpointError("a checkpoint is already open on this session")
        self._open = Checkpoint(self.planes, self.position, token_count)
        self._open_tokens = len(self.tokens)
        return self._open

    def _close(self, cp: Checkpoint) -> None:
        if cp is not self._open:
            raise CheckpointError("that checkpoint does not belong to this session (or is closed)")
        self._open = None

    def commit(self, cp: Checkpoint) -> None:
        self._close(cp)
        cp.commit()

    def rollback(self, cp: Checkpoint, keep: int) -> None:
        if cp is not self._open:
            raise CheckpointError("that checkpoint does not belong to this session (or is closed)")
        cp.rollback(keep)                        # validates keep before changing anything
        self._open = None
        del self.tokens[self._open_tokens + keep:]
