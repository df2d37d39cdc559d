"""Chunks on CUDA through the decode step's kernels: one arithmetic per token.

Owns: `chunk_pass(step, engine, sessions, chunks, all_logits, logits)` -- a
prefill chunk, a verification block or several sessions' chunks in one pass,
computed with the very launches a decode step runs (decode_step.DecodeStep's
layer loop: `dot_rows` projections with the decode tiles' K steps, the same
add+norm / act*up / expert kernels, the decode attention launch's own q/k/v
preparation) and attention by triton_chunk.chunk_attention, which reduces each
row as the decode kernel does.  So the logits and K/V rows of position p are
bitwise the same whether p was decoded, verified, or prefilled in a chunk of
any size beside any neighbours.  Does not own: the transaction (backends/step.py's
`forward` runs this pass inside its checkpoints), staging (muser.cache.stage:
attend before overwrite), the kernels.

Per layer and session:  prepare_rows (q, k, v for every row of the pass) ->
stage(plane, start, k, v) -> chunk_attention over the staged view -> commit.
"""
from __future__ import annotations

from array import array
from itertools import chain

import torch

from ...cache import stage
from ..step import row_offsets
from .triton_chunk import chunk_attention
from .triton_decode import prepare_rows
from .triton_pieces import upload


def chunk_pass(step, engine, sessions, chunks, all_logits: bool, pad: bool = False,
               logits: bool = True, graphs=None) -> torch.Tensor:
    """float32 logits as backends/step.forward's pass returns them (`pad` is moot: no row of
    this pass depends on the chunk's shape, so no scratch rows are added).  `graphs`
    (chunk_graph.ChunkGraphs): one session's chunk in one graph replay, the same bits."""
    if graphs is not None and graphs.applies(sessions, chunks):
        out = graphs.run(engine, sessions[0], chunks[0], all_logits, logits)
        if out is not None:
            return out
    spec, dev = engine.spec, engine.device
    starts = [s.position for s in sessions]
    real = [len(c) for c in chunks]
    offs = row_offsets(real)                  # session b's rows: [offs[b], offs[b] + real[b])
    # no wait for the previous pass's kernels before this one's launches
    # the ids by C copies (a 16k list through torch.tensor: ~0.8 ms before the first kernel;
    # Session._validate's array is copied as a buffer, ~4 us)
    flat = array("q", chunks[0]) if len(chunks) == 1 else array("q", chain.from_iterable(chunks))
    ids = upload(torch.frombuffer(flat, dtype=torch.long), dev)
    pos = torch.cat([torch.arange(s, s + r, device=dev) for s, r in zip(starts, real)])

    def attend(i, lw, ls, qkv, qn, kn):
        cos, sin = step.rope[i]
        lay, cap = step.lays[i], step.caps[i]
        q, k, v = prepare_rows(qkv, pos, cos, sin, qn, kn, spec.norm_eps, spec.num_heads,
                               ls.kv_heads, ls.head_dim, step.splits[i], spec.rope_interleaved,
                               v_norm=spec.v_norm, k_eq_v=lw.wv is None, capacity=cap, **lay)
        out = torch.empty_like(q)
        for b, s in enumerate(sessions):
            a, z = offs[b], offs[b] + real[b]
            plane = s.planes[s.plane_of[i]]
            staged = stage(plane, starts[b], k[a:z], v[a:z])
            # the ring decode route stores first and leaves the ring in place, rotation and all
            ring = None if staged.ordered else (plane.origin_physical, plane.capacity)
            chunk_attention(q[a:z], staged.keys, staged.values, starts[b], staged.first_position,
                            plane.window, spec.layer_scale(ls), spec.attn_logit_softcap,
                            spec.rope_interleaved, lay, sinks=lw.sinks, ring=ring, out=out[a:z])
            staged.commit()
        return out

    x = step.layers(ids, attend)
    if not logits:
        return torch.empty((0, spec.vocab_size), dtype=torch.float32, device=dev)
    if all_logits:
        return step.head(x)
    last = [o + r - 1 for o, r in zip(offs, real)]
    if len(last) == 1:                        # a slice: no index upload (which would wait)
        return step.head(x[last[0]:last[0] + 1])
    return step.head(x.index_select(0, upload(torch.tensor(last, dtype=torch.long), dev)))
