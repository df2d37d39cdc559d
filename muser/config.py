"""Frozen configuration records, passed explicitly.

Owns: the *layer map* (`LayerSpec`, `ModelSpec`) -- the only place the engine
learns whether a layer is sliding or full -- and the engine's run settings.
Does not own: how a spec is read from a config.json or a GGUF header
(`muser.model.spec`), or any tensor.

Glossary (one meaning per word, see docs/architecture.md):
  position  absolute token index in a session, 0-based, ranges half-open [p0, p1)
  row       one token's K (or V) vector for one layer: kv_heads x head_dim elements
  window W  a sliding layer's span: a query at p sees keys at p-W+1 .. p
  capacity  rows a plane can hold; ring: min(max_context, W); growing: up to max_context
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

LayerKind = Literal["sliding", "full"]


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE frequency schedule beyond plain/linear (linear is `LayerSpec.rope_scale`).

    yarn          (gpt-oss, OLMo 3 long-context) NTK-by-parts interpolation between the
                  plain and the factor-scaled frequencies over the dims whose wavelength
                  falls between beta_fast and beta_slow rotations of `original_context`,
                  and cos/sin multiplied by `attention_factor` (None -> 0.1 ln(factor) + 1).
    proportional  (Gemma 4 global layers) only the first `partial` of the head's angles
                  rotate, with exponents over the WHOLE head dim; the rest have frequency
                  0 (cos 1, sin 0: passed through unrotated).
    The maths is `muser.model.rope.inv_freq`; this record only names the schedule.
    """

    kind: Literal["yarn", "proportional", "llama3"]
    factor: float = 1.0
    partial: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    original_context: int = 4096
    truncate: bool = True
    attention_factor: float | None = None
    low_freq: float = 1.0
    high_freq: float = 4.0


@dataclass(frozen=True)
class LayerSpec:
    index: int
    kind: LayerKind
    window: int | None          # sliding: W >= 1; full: None
    rope: bool                  # False = NoPE (Cohere2's full layers)
    rope_theta: float = 10000.0  # ignored when rope is False
    rope_scale: float = 1.0     # linear position scaling (positions / rope_scale)
    rope_scaling: RopeScaling | None = None   # yarn / proportional (None: plain or linear)
    # Per-layer geometry (Gemma 4: global layers have 512-wide heads).  None = the model's
    # own num_kv_heads / head_dim; `ModelSpec` fills them, so a built spec never holds None.
    head_dim: int | None = None
    kv_heads: int | None = None
    # KV sharing (Gemma 4): this layer computes no K/V and owns no plane; it attends over
    # layer `kv_source`'s plane (an earlier layer of the same kind and geometry).
    kv_source: int | None = None
    k_eq_v: bool = False        # Gemma 4 global layers: V is the K projection (before k-norm)

    def __post_init__(self):
        if self.kind == "sliding" and (self.window is None or self.window < 1):
            raise ValueError(f"layer {self.index}: a sliding layer needs window >= 1, got {self.window}")
        if self.kind == "full" and self.window is not None:
            raise ValueError(f"layer {self.index}: a full layer has no window, got {self.window}")
        if self.kv_source is not None and not 0 <= self.kv_source < self.index:
            raise ValueError(f"layer {self.index}: kv_source must be an earlier layer, got {self.kv_source}")

    @property
    def owns_plane(self) -> bool:
        return self.kv_source is None


@dataclass(frozen=True)
class ModelSpec:
    """Everything the transformer needs to know about a checkpoint's shape and maths."""

    architecture: str           # "gemma3" | "cohere2" | "llama" | "qwen2" | "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    norm_eps: float
    layers: tuple[LayerSpec, ...]
    tie_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # --- architecture knobs (defaults = Llama) ---
    embed_scale: float = 1.0            # Gemma: sqrt(hidden_size)
    query_scale: float | None = None    # softmax scale; None -> head_dim ** -0.5
    logit_scale: float = 1.0            # Cohere2 multiplies the logits
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    activation: str = "silu"            # "silu" | "gelu_tanh"
    norm: str = "rms"                   # "rms" | "layernorm" (Cohere: no bias)
    qk_norm: bool = False               # Gemma 3: RMS norm on q and k per head
    sandwich_norm: bool = False         # Gemma: post-attention and post-feed-forward norms
    parallel_block: bool = False        # Cohere: attention and MLP read the same normed input
    rope_interleaved: bool = False      # Cohere: rotate (x0,x1),(x2,x3).. pairs
    attention_bias: bool = False        # Qwen2: q/k/v biases; gpt-oss: q/k/v/o biases
    # --- hybrid families (2025-2026) ---
    pre_norm: bool = True               # False (OLMo 3, EXAONE 4): no input norms, post-norms only
    qk_norm_span: str = "head"          # "head": RMS over each head (Gemma); "all": over all heads (OLMo 3)
    v_norm: bool = False                # Gemma 4: unscaled RMS norm on each value head
    attention_sinks: bool = False       # gpt-oss: a learned logit per head joins each softmax
    moe: "MoeSpec | None" = None        # top-k mixture of experts (model/moe.py)
    per_layer_input: int = 0            # Gemma 4 per-layer input embeddings: width per layer (0 = none)
    extra: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self):
        # Resolve each layer's geometry once, here: every LayerSpec of a built spec is concrete.
        layers = tuple(l if l.head_dim is not None and l.kv_heads is not None else
                       replace(l, head_dim=l.head_dim or self.head_dim, kv_heads=l.kv_heads or self.num_kv_heads)
                       for l in self.layers)
        object.__setattr__(self, "layers", layers)
        for l in layers:
            if l.kv_source is None:
                continue
            src = layers[l.kv_source]
            if (src.kind, src.window, src.head_dim, src.kv_heads) != (l.kind, l.window, l.head_dim, l.kv_heads) \
                    or src.kv_source is not None:
                raise ValueError(f"layer {l.index}: shares layer {l.kv_source}'s plane but their kind/window/"
                                 f"geometry differ or the source shares too")

    @property
    def uniform_geometry(self) -> bool:
        """Every layer owns a plane of the model's own head_dim and kv heads (the CUDA graph path's case)."""
        return all(l.head_dim == self.head_dim and l.kv_heads == self.num_kv_heads and l.owns_plane
                   for l in self.layers)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def layer_scale(self, ls: LayerSpec) -> float:
        """Softmax scale of a layer: query_scale, else its own head_dim ** -0.5."""
        return self.query_scale if self.query_scale is not None else ls.head_dim ** -0.5

    @property
    def scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim ** -0.5


@dataclass(frozen=True)
class MoeSpec:
    """A top-k mixture-of-experts feed-forward (the maths: muser.model.moe).

    style "gpt_oss": router = linear + bias, softmax over the top-k logits; experts are
        clamped SwiGLU with biases: (clamp(up, +-limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit).
    style "gemma4": router = unscaled RMS norm, * scale * hidden^-0.5, linear, softmax over all
        experts, top-k renormalized, * per-expert scale; experts are GeLU-tanh GLUs; the block
        runs beside a dense MLP (each with its own norms) and the two outputs are summed.
    """

    style: str
    num_experts: int
    top_k: int
    intermediate_size: int
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0


# the weight modes that quantize the head alone: every K/V row is the float weights', so their
# cuts share the float mode's encoding (CUDA, backends/cuda/weights_int8.py)
HEAD_ONLY = ("int8-head", "int8-head-fast")


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs a model: where, in what dtype, through which cache backend."""

    device: str = "cpu"
    dtype: str = "float32"              # float32 | bfloat16 | float16
    backend: Literal["ring", "oracle"] = "ring"
    max_context: int | None = None      # None -> the model's own max_context
    chunk_size: int = 512               # default prefill chunk
    # "none" | "int8" (CPU: muser.model.quant; CUDA: backends/cuda/weights_int8) | "int8-head"
    # (CUDA: the head alone, as Q8_0 blocks: bf16's logits) | "int8-head-fast" (CUDA: the head
    # alone, as int8 rows in the fast tile: its own logits)
    quant: str = "none"
