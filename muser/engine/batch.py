"""One decode step for several sessions at once (CPU and any device without a graph runner).

Owns: `decode_batch(engine, sessions, tokens)`: the B new tokens share every
matmul (weights are read once per step, not once per session) while each
session attends over its own planes at its own position.  Does not own: the
CUDA graph runner (cuda_graph.py) or sessions' caches.

Exactness: row i of a batched matmul equals the one-row matmul only when the
kernel is row-invariant.  The int8 fast path's kernels are (exact integer sums,
csrc/a8w8.c), and each session's attention runs the same positional kernel as a
lone decode step, so there a batched step is bitwise equal to each session
decoding alone; `Engine.decode_batch` takes this path only then.  Every session
is guarded by its own checkpoint: a failure rolls all of them back.
"""
from __future__ import annotations

import torch

from ..attention.reference import visibility_mask
from ..cache import Checkpoint, stage
from ..errors import RequestError
from ..model import transformer as tf
from .session import attend_positional


def decode_batch(engine, sessions, tokens: list[int]) -> torch.Tensor:
    if len({id(s) for s in sessions}) != len(sessions):
        raise RequestError("decode_batch got the same session twice")
    ids = [s._validate([t])[0] for s, t in zip(sessions, tokens)]
    spec = engine.spec
    starts = [s.position for s in sessions]
    guards = [Checkpoint(s.planes, p, 1) if s._open is None else None for s, p in zip(sessions, starts)]
    try:
        ids_t = torch.tensor(ids, dtype=torch.long, device=engine.device)
        positions = torch.tensor(starts, dtype=torch.long, device=engine.device)   # [B]
        h = tf.embed(engine.weights, spec, ids_t)                                  # [B, hidden]
        memo: dict = {}
        for li, (layer_spec, lw) in enumerate(zip(spec.layers, engine.weights.layers)):
            planes = [s.planes[li] for s in sessions]

            def attend(q, k, v, planes=planes):          # q [B, H, D], k/v [B, KV, D]
                outs = []
                positional = engine.positional_attention
                for b, plane in enumerate(planes):
                    staged = stage(plane, starts[b], k[b:b + 1], v[b:b + 1])
                    if positional is not None:            # the same kernel as a lone decode step
                        outs.append(attend_positional(positional, plane, staged, q[b:b + 1], starts[b], spec))
                        staged.commit()
                        continue
                    mask = None
                    if staged.needs_mask:
                        mask = visibility_mask(positions[b:b + 1], staged.key_positions(), plane.window)
                    outs.append(engine.attention(q[b:b + 1], staged.keys, staged.values, mask,
                                                 spec.scale, spec.attn_logit_softcap))
                    staged.commit()
                return torch.cat(outs, dim=0)
            h = tf.layer_forward(lw, spec, layer_spec, h, positions, attend, memo)
        logits = tf.logits(engine.weights, spec, tf.final_hidden(engine.weights, spec, h))
    except BaseException:
        for g in guards:
            if g is not None and g.open:
                g.rollback(0)
        raise
    for s, g, t in zip(sessions, guards, ids):
        if g is not None:
            g.commit()
        s.tokens.append(t)
    return logits                                                                   # [B, vocab]
