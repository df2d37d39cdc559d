"""A session: one conversation's cache and the calls that fill it.

Owns: `Session` -- prefill / decode / extend, snapshot / restore, speculative
checkpoints.  Every call is one forward of the engine (`Engine.forward`, run by
the backend's step driver, muser.backends.step): transactional, so a failed
forward leaves the cache exactly as it was.  Does not own: the transformer
maths (muser.model.transformer), plane layouts (muser.cache), the forward
itself (muser.backends) or sampling.
"""
from __future__ import annotations

from array import array

import torch

from ..cache import Checkpoint, build_planes, plane_index
from ..cache import snapshot as cut
from ..errors import CacheOverflow, CheckpointError, RequestError


class Session:
    def __init__(self, engine):
        self.engine = engine
        spec = engine.spec
        self.planes = build_planes(spec.layers, engine.config.backend, engine.max_context,
                                   spec.num_kv_heads, spec.head_dim, engine.cache_dtype, engine.device)
        self.plane_of = plane_index(spec.layers)      # layer -> index into self.planes (KV sharing)
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
    def _validate(self, ids) -> array:
        """`ids` packed as int64 (`array("q")`: a sequence of ints, sliced without a Python
        loop), each in the vocabulary; refused whole otherwise.  Checked in C (array + one
        aminmax): a 16k prompt's ids through int() and a Python range check were ~1 ms of an
        H200's 68 ms prefill, all of it before the first kernel.  Kept packed for the passes:
        a CUDA chunk's upload (chunk_step, chunk_graph) copies it in ~4 us where packing a
        16k list again took ~0.33 ms, and no `tolist` (~0.23 ms) is paid here."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise RequestError(f"token ids must be a 1-D sequence, got a tensor of shape "
                                   f"{tuple(ids.shape)}")
            ids = ids.tolist()
        try:
            packed = array("q", ids)             # integers only: a float or a string is refused
        except (TypeError, OverflowError) as e:
            raise RequestError(f"token ids must be integers, got {e}") from None
        if not packed:
            raise RequestError("expected at least one token id, got none")
        vocab = self.engine.spec.vocab_size
        if len(packed) <= 1024:                  # a decode step's id: no tensor made (~3 us)
            lo, hi = min(packed), max(packed)
        else:
            lo, hi = (int(x) for x in torch.aminmax(torch.frombuffer(packed, dtype=torch.int64)))
        if lo < 0 or hi >= vocab:
            bad = [i for i in packed if not 0 <= i < vocab]
            raise RequestError(f"token ids must be in [0, {vocab}), got {bad[:5]}")
        if self.position + len(packed) > self.engine.max_context:
            raise CacheOverflow(-1, self.engine.max_context, self.position + len(packed))
        return packed

    def prefill(self, ids, chunk_size: int | None = None, logits: bool = True) -> torch.Tensor | None:
        """Consume `ids`; return float32 logits [vocab] of the last position (None without
        `logits`: a piece of a longer prompt -- the head, ~6 ms of a CPU step, is skipped).  Only
        the last chunk computes logits; the planes are the same either way."""
        ids = self._validate(ids)
        chunk = chunk_size or self.engine.config.chunk_size
        if chunk < 1:
            raise RequestError(f"chunk_size must be >= 1, got {chunk}")
        out = None
        for i in range(0, len(ids), chunk):
            last = i + chunk >= len(ids)
            out = self.engine._forward([self], [ids[i:i + chunk]], False, True, logits and last)
        return out[-1] if logits else None

    def decode(self, token_id: int) -> torch.Tensor:
        """Consume one token; return float32 logits [vocab] for the next one."""
        return self.engine._forward([self], [self._validate([token_id])], False, False)[0]

    def extend(self, ids) -> torch.Tensor:
        """Consume `ids` in one chunk; return float32 logits [len(ids), vocab] (verification)."""
        return self.engine._forward([self], [self._validate(ids)], True, True)

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
