"""The decode step on CUDA as a fixed sequence of launches over static buffers.

Owns: `DecodeStep`, the maths of one token for B sessions: 1 embedding (with the
first norm, `triton_ops.embed_norm`), then
per layer 1 qkv GEMM, 1 attention (qk-norm, RoPE, the store of the new row and
the attention itself, triton_decode.fused_decode_attention), 1 o GEMM, 1
add+norm, 1 gate/up GEMM (+ 1 act*mul when it is not fused into the GEMV), 1
down GEMM, 1 add+norm; the head.
Does not own: plane bookkeeping, plane tables or graph capture
(graph.py), the kernels (triton_ops.py, triton_decode.py), the fused weights and
which models the step takes (step_weights.py).

Every projection and the head, for any batch size, go through
`triton_dot.dot_rows` (rows in tiles of 16 on the tensor cores, K in fixed
steps and fixed split-K pieces): its launch depends on the weight's shape only
and a row's sums never see the other rows, so a session's logits and K/V rows
are bitwise the same decoded alone or beside 15 others.  cuBLAS picks its
kernel by the row count (batch-variant), and the batch-1 `gemv` is ~10% faster
at batch 1 but cannot serve a batch at speed (benchmarks/NOTES.md, CUDA).
Experiment switches, fixed at construction (from the `Env` the runner passes)
so every replay of an engine uses the same kernels: MUSER_GEMV=dot (default,
batch-invariant) | fast (batch 1 through `gemv`, larger batches and the head
through cuBLAS: the previous default, NOT batch-invariant) | none (cuBLAS for
all); MUSER_ATTN=separate (qk_rope_store + attention as two launches) | fused
(default).

Inputs live in device tensors so the step can be captured once and replayed:
`packed` int64 = [ids (B) | positions (B) | per plane group: (slot, n) x B],
`tables` int64 [L, B, 4] (see triton_decode).  Nothing here reads the host.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ...env import Env
from ...model import ops
from ...model import transformer as tf
from .triton_decode import DecodeWorkspace, decode_attention, fused_decode_attention, merge_groups
from .step_weights import fuse_weights, head_picks, via_dot
from .step_ffn import ffn, mlp, norm_all
from .step_norm import Pending, fused, norm_later, ready
from .cpp_dot import load as load_cpp
from .cpp_route import SPLIT
from .triton_dot import Pieces, dot_rows
from .triton_dot_tiles import dot_config, tma_pays
from .l2_prefetch import step_plans
from .triton_gemv import gemv
from .weights_int8 import HeadInt8, RowInt8
from .triton_ops import add_norm, embed_norm, qk_rope_store
from .triton_pick import pick_partials


class DecodeStep:
    """One decode step for a fixed batch size; `run(packed, tables, ws)` -> logits [B, vocab] f32."""

    def __init__(self, engine, layer_groups: list[int], layer_splits: list[int], n_groups: int,
                 layer_layouts: list[dict], layer_caps: list[int], env: Env = Env()):
        self.engine = engine
        self.spec = spec = engine.spec
        self.w = engine.weights
        self.fused = fuse_weights(engine.weights)
        self.groups, self.splits, self.n_groups = layer_groups, layer_splits, n_groups
        # per layer: triton_attn.layout (the reduction shape: a decode step and a chunk share
        # it) and the ring capacity (0: a growing plane)
        self.lays, self.caps = layer_layouts, layer_caps
        dev = engine.device
        self.rope = []
        for ls in spec.layers:
            if ls.rope:
                self.rope.append(ops.rope_tables(ls.rope_theta, ls.rope_scale, ls.head_dim, dev,
                                                 spec.max_context, ls.rope_scaling))
            else:
                self.rope.append((None, None))
        self.embed_scale = (torch.tensor(spec.embed_scale, dtype=engine.dtype, device=dev)
                            if spec.embed_scale != 1.0 else None)
        self.layernorm = spec.norm != "rms"
        mode = env.gemv
        self.gemv_for = {"none": (), "fast": ("qkv", "o", "down", "gu"),
                         "dot": ("qkv", "o", "down", "gu", "head")}[mode]
        self.batch1_only = mode == "fast"         # gemv: batch 1 only (batch-variant)
        self.gemv = gemv if mode == "fast" else dot_rows
        self.gelu = spec.activation == "gelu_tanh"
        # the separate form has no v-norm / V = K: Gemma 4 always takes the fused attention
        self.fused_attn = env.attn != "separate" or spec.v_norm or any(l.k_eq_v for l in spec.layers)
        self.flatten = env.flatten in ("dot", "on")   # dot_rows' in-kernel pieces: one loop
        # a chunk's 128-row tiles load by TMA (on|auto|off): tensor descriptors need sm_90;
        # before it the pointer tiles (the same bits) whatever MUSER_DOT_TMA says
        self.tma = (env.dot_tma if dev.type == "cuda"
                    and torch.cuda.get_device_capability(dev)[0] >= 9 else "off")
        self.fuse_sum = env.fuse_sum == "on"    # the down projection's pieces summed in add_norm
        # row counts past 2,048 whose chunk passes run as captured graphs (set by the chunk
        # graphs, chunk_graph.ChunkGraphs._set_limit): MUSER_DOT_TMA=auto takes TMA for every weight
        self.graph_rows: frozenset[int] = frozenset()
        self.attn_regs = env.attn_regs          # the attention launch's register cap (`regs_for`)
        # per layer, the l2_prefetch.Prefetch its attention launch runs (l2_prefetch.step_plans),
        # in steps of at most prefetch_rows rows (auto: one row -- a 16-row step lost 20 us to
        # it).  (The bulk prefetch is an sm_90 instruction: none before Hopper.)
        hopper = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        self.prefetch = (step_plans(self.w.layers, self.fused, self.lays, env) if hopper
                         else [None] * len(spec.layers))
        self.prefetch_rows = 1 if env.prefetch == "auto" else 1 << 30
        # programmatic dependent launch for the step's own kernels (MUSER_PDL; sm_90 and up)
        self.pdl = (env.pdl == "on" and dev.type == "cuda"
                    and torch.cuda.get_device_capability(dev)[0] >= 9)
        # MUSER_ATTN_EARLY: `early` of the attention launch
        self.attn_early = self.pdl and env.attn_early == "on"
        # MUSER_DOT_CPP: bf16 projections of <= 16 rows through the CUDA C++ kernel (the same
        # bits); None: off, or it could not be built / loaded here (load warned)
        self.cpp = (load_cpp(env.dot_cpp, env.native_dir, dev)
                    if env.dot_cpp != "off" and self.gemv is dot_rows else None)
        # MUSER_DOT_CPP=norm: the add+norms before qkv and gate|up made inside them (step_norm)
        self.norm_later = norm_later(spec, self.w, self.cpp, env.dot_cpp)
        # a chunk through this step's layer loop has a decode step's bits only with the default
        # kernels: dot_rows for every row count, and the fused attention launch (whose first
        # half prepares a chunk's q/k/v); the experiment switches give that up
        self.invariant = mode == "dot" and self.fused_attn
        # the pipelined greedy step may pick in the head (`head_pick`)
        self.fused_pick = dev.type == "cuda" and head_picks(spec, self.w.output, self.gemv_for)

    def regs_for(self, batch: int) -> int | None:
        """The decode-attention launch's register cap (register allocation only: the same
        bits).  auto: 168 from 8 sessions on -- 16 sessions x 17 ring splits are 272 programs,
        past the 264 that fit the H200's 132 SMs two at a time at 208 registers; at 168, three
        fit (396) -- none below (one session's 17 programs have SMs to spare)."""
        if self.attn_regs == "auto":
            return 168 if batch >= 8 else None
        return None if self.attn_regs == "off" else int(self.attn_regs)

    def workspace(self, batch: int) -> DecodeWorkspace:
        """One workspace for every layer: sized for the largest kv-head count, group, head dim,
        splits and merge groups."""
        s = self.spec
        kv = max(l.kv_heads for l in s.layers)
        group = max(s.num_heads // l.kv_heads for l in s.layers)
        ngroups = max(merge_groups(n, lay["group"]) for n, lay in zip(self.splits, self.lays))
        return DecodeWorkspace(batch, kv, group, max(l.head_dim for l in s.layers),
                               max(self.splits), self.engine.device, ngroups)

    def _dot(self, x, w, defer: bool = False, widen: bool = False, **kw):
        """dot_rows (with PDL when on; int8 rows with their scales) or, in MUSER_GEMV=fast, the
        older gemv.  `defer`: dot_rows may return its split-K pieces unsummed (Pieces) for the
        add_norm that consumes them (MUSER_FUSE_SUM); gemv sums its own.  `widen`: the result
        as float32 (the activation-dtype values: `.float()`'s bits, in dot_rows' own store).
        x may be a step_norm.Pending: the C++ kernel makes it, else the add_norm launch."""
        if isinstance(x, Pending):
            y = fused(self, x, w, dict(kw, widen=widen))
            if y is not None:
                return y
            x = ready(self, x)
        if self.cpp is not None and not (widen or kw.get("pick") or kw.get("bias") is not None):
            glu = kw.get("glu", False)
            n, k = (w.shape[0] // 2 if glu else w.shape[0]), w.shape[1]
            piece = dot_config(n, k, glu)[4]
            plan = self.cpp.plan(x, w, n, glu, kw.get("gelu", False), piece, defer)
            if plan is not None:            # int8 rows' pieces leave with their scales
                y = self.cpp(x, w, n, plan, self.pdl)
                return (Pieces(y, w.scale if isinstance(w, RowInt8) else None)
                        if plan[0] == SPLIT else y)
        if isinstance(w, HeadInt8):         # every row through the one unfenced decode tile
            return dot_rows(x, w.q, scale=w.scale, pdl=self.pdl, rows=16, own_tile=True,
                            widen=widen, **kw)
        if isinstance(w, RowInt8):
            return dot_rows(x, w.q, scale=w.scale, pdl=self.pdl, flatten=self.flatten,
                            defer=defer, widen=widen, **kw)
        if self.gemv is dot_rows:
            rows = x.shape[0]
            tma = self.tma == "on" or (self.tma == "auto" and
                                       tma_pays(w.numel(), rows, rows in self.graph_rows))
            return dot_rows(x, w, pdl=self.pdl, flatten=self.flatten, defer=defer, widen=widen,
                            tma=tma, **kw)
        y = self.gemv(x, w, **kw)
        return y.float() if widen else y

    def _linear(self, what, x, w, b=None, defer: bool = False):
        """x @ w.T (+ b); `defer` as `_dot`'s."""
        if via_dot(w, what, self.gemv_for, self.batch1_only, x.shape[0]):
            return self._dot(x, w, bias=b, defer=defer)
        return F.linear(ready(self, x), w, b)

    def run(self, packed: torch.Tensor, tables: torch.Tensor, ws: DecodeWorkspace,
            ids: torch.Tensor | None = None, pick: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step: float32 logits [B, vocab] (see the module doc for the inputs).
        `ids` [B]: the step's ids from elsewhere than packed[:B] (the greedy graph: the last
        picks, in place); `pick` res [2, B] int64: return it holding each row's greedy token
        and ok flag instead of the logits (`head_pick`; fused_pick only)."""
        spec = self.spec
        B = tables.shape[1]
        ids, pos = (packed[:B] if ids is None else ids), packed[B:2 * B]
        metas = [packed[2 * B + 2 * B * g: 2 * B + 2 * B * (g + 1)] for g in range(self.n_groups)]
        maxnreg = self.regs_for(B)            # one batch size, one cap for every layer
        few = B <= self.prefetch_rows
        prefetch = self.prefetch if few else [None] * len(self.prefetch)

        def attend(i, lw, ls, qkv, qn, kn):
            meta, table = metas[self.groups[i]], tables[i]
            KV, D = ls.kv_heads, ls.head_dim
            cos, sin = self.rope[i]
            lay = dict(capacity=self.caps[i], maxnreg=maxnreg, **self.lays[i])
            if self.fused_attn:
                return fused_decode_attention(qkv, pos, cos, sin, qn, kn, spec.norm_eps, table, meta,
                                              spec.num_heads, KV, D, self.splits[i],
                                              spec.layer_scale(ls), spec.attn_logit_softcap,
                                              spec.rope_interleaved, ws, sinks=lw.sinks,
                                              v_norm=spec.v_norm, k_eq_v=lw.wv is None,
                                              pdl=self.pdl, prefetch=prefetch[i],
                                              early=self.attn_early, **lay)
            q = qk_rope_store(qkv, pos, cos, sin, qn, kn, spec.norm_eps, table, meta,
                              spec.num_heads, KV, D, spec.rope_interleaved)
            return decode_attention(q, pos, table, meta, KV, self.splits[i], spec.layer_scale(ls),
                                    spec.attn_logit_softcap, ws, sinks=lw.sinks, **lay)

        x = self.layers(ids, attend)
        return self.head(x) if pick is None else self.head_pick(x, pick)

    def layers(self, ids: torch.Tensor, attend) -> torch.Tensor:
        """Rows of token ids through every layer -> the final-normed hidden rows [R, hidden].
        `attend(i, lw, ls, qkv, q_norm, k_norm)` -> [R, H, D]: the layer's attention over its
        planes (a decode step's launch, or a chunk's: chunk_step.py)."""
        spec, w = self.spec, self.w
        H, eps = spec.num_heads, spec.norm_eps
        layers = w.layers
        # post-norm families (OLMo 3, EXAONE 4) read the residual stream itself: no attn_norm
        h, x = embed_norm(ids, w.embed, self.embed_scale,
                          layers[0].attn_norm if spec.pre_norm else None, eps, self.layernorm,
                          pdl=self.pdl)
        x = h if x is None else x
        for i, (lw, ls, fz) in enumerate(zip(layers, spec.layers, self.fused)):
            R = x.shape[0]
            KV, D = ls.kv_heads, ls.head_dim
            qkv = self._linear("qkv", x, fz["wqkv"], fz["bqkv"])
            qn, kn = (lw.q_norm, lw.k_norm) if spec.qk_norm else (None, None)
            if qn is not None and spec.qk_norm_span == "all":
                qkv, qn, kn = norm_all(self, qkv, lw, H * D, KV * D), None, None
            a = attend(i, lw, ls, qkv, qn, kn)
            nxt = layers[i + 1].attn_norm if i + 1 < len(layers) else w.final_norm
            o = self._linear("o", a.view(R, H * D), lw.wo, lw.bo)
            if spec.parallel_block:
                h, x = add_norm(h, nxt, eps, self.layernorm, d1=o, d2=mlp(self, lw, fz, x),
                                pdl=self.pdl)
                continue
            post = spec.sandwich_norm or not spec.pre_norm     # transformer.layer_forward's rule
            post_attn = lw.post_attn_norm if post else None
            h, x = self._add_norm(h, lw.pre_ffn_norm if spec.pre_norm else None, o, post_attn)
            # MUSER_FUSE_SUM: the down projection's split-K pieces summed by the add_norm below
            m = ffn(self, lw, fz, h, h if x is None else x,
                          defer=self.fuse_sum and lw.layer_scale is None)
            post_ffn = lw.post_ffn_norm if post else None
            if lw.layer_scale is None:
                # not the final norm: each of the head's 4,096 programs would load the rows
                # (the 1B: 7 pieces, ~130 MB a step) and store the same h' and x lines, 4,096
                # stores a line, to save one launch
                h, x = self._add_norm(h, nxt, m, post_ffn, later=i + 1 < len(layers))
                x = h if x is None else x                  # post-norm: the next layer reads h
            else:                                  # Gemma 4: scale the layer's output, then norm
                h = add_norm(h, None, eps, self.layernorm, d1=m, w_post=post_ffn)[0] * lw.layer_scale
                x = add_norm(h, nxt, eps, self.layernorm)[1]
        return x

    def _add_norm(self, h, w_next, d1, w_post, later: bool = True):
        """add_norm(h, w_next, d1=d1, w_post=w_post) -> (h', x); with `norm_later` x is a
        step_norm.Pending the projection after it makes (never the head's: `later` False)."""
        if self.norm_later and later and w_next is not None and w_post is not None:
            h_out = torch.empty_like(h)
            return h_out, Pending(h, d1, w_post, w_next, h_out)
        return add_norm(h, w_next, self.spec.norm_eps, self.layernorm, d1=d1, w_post=w_post,
                        pdl=self.pdl)

    def head_pick(self, x: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        """Final-normed rows -> res [2, B] int64: `pick_rows(self.head(x))`'s tokens and ok
        flags, the logits never stored -- each head tile's first maximum a row, folded in
        column order (triton_pick.pick_partials)."""
        if not self.fused_pick:
            raise ValueError("this step's head cannot pick (not dot_rows, or a logit scale / "
                             "soft-cap after it): pick_rows(run(...)) instead")
        vals, idx = self._dot(x, self.w.output, pick=True)
        return pick_partials(vals, idx, res, pdl=self.pdl)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden rows -> float32 logits [R, vocab]."""
        w = self.w
        if via_dot(w.output, "head", self.gemv_for, self.batch1_only, x.shape[0]):
            return tf.finish_logits(self._dot(x, w.output, widen=True), self.spec)
        return tf.logits(w, self.spec, x)
