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

from dataclasses import dataclass, field
from typing import Literal

LayerKind = Literal["sliding", "full"]


@dataclass(frozen=True)
class LayerSpec:
    index: int
    kind: LayerKind
    window: int | None          # sliding: W >= 1; full: None
    rope: bool                  # False = NoPE (Cohere2's full layers)
    rope_theta: float = 10000.0  # ignored when rope is False
    rope_scale: float = 1.0     # linear position scaling (positions / rope_scale)

    def __post_init__(self):
        if self.kind == "sliding" and (self.window is None or self.window < 1):
            raise ValueError(f"layer {self.index}: a sliding layer needs window >= 1, got {self.window}")
        if self.kind == "full" and self.window is not None:
            raise ValueError(f"layer {self.index}: a full layer has no window, got {self.window}")


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
    attention_bias: bool = False        # Qwen2: q/k/v biases
    extra: tuple[tuple[str, object], ...] = field(default=())

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim ** -0.5


@dataclass(frozen=True)
class EngineConfig:
    """How an engine runs a model: where, in what dtype, through which cache backend."""

    device: str = "cpu"
    dtype: str = "float32"              # float32 | bfloat16 | float16
    backend: Literal["ring", "oracle"] = "ring"
    max_context: int | None = None      # None -> the model's own max_context
    chunk_size: int = 512               # default prefill chunk
    quant: str = "none"                 # CPU fast path: "none" | "int8" (see muser.model.quant)
