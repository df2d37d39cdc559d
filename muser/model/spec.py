"""The layer map: a checkpoint's config turned into a frozen `ModelSpec`.

Owns: every decision about a layer's kind (sliding or full), its window, its
RoPE (base, linear scale, or none), and the architecture knobs the transformer
reads (norm style, soft-caps, scales).  This is the ONLY place those are
decided; loaders and the transformer read the spec and never re-derive them.
Does not own: tensors (`weights`, loaders) or the maths (`transformer`).

Sources: a HF `config.json` dict (`spec_from_hf_config`) or a GGUF header
(`spec_from_gguf`).  A GGUF of Gemma 3 carries no sliding pattern and no
local RoPE base, so Gemma 3's published conventions fill them in.
"""
from __future__ import annotations

import math
from pathlib import Path

from muser.config import LayerSpec, ModelSpec
from muser.errors import ModelFormatError

# Gemma 3's conventions (its config class defaults), used where a source is silent.
GEMMA3_SLIDING_PATTERN = 6          # every 6th layer (5, 11, 17, ...) is full attention
GEMMA3_LOCAL_BASE = 10_000.0
GEMMA3_GLOBAL_BASE = 1_000_000.0
GEMMA3_END_OF_TURN = 106            # <end_of_turn>: an instruction-tuned Gemma ends its turn with it
COHERE2_SLIDING_PATTERN = 4

_FULL, _SLIDING = "full_attention", "sliding_attention"


def _layer_types(n: int, pattern: int) -> list[str]:
    """HF's rule: layer i is full iff (i + 1) % pattern == 0."""
    return [_FULL if (i + 1) % pattern == 0 else _SLIDING for i in range(n)]


def _rope_params(cfg: dict, kind: str, default_theta: float) -> tuple[float, float]:
    """(theta, linear scale) for a layer type, reading transformers 5's `rope_parameters`
    (flat, or keyed by layer type) and the older `rope_theta` / `rope_scaling` keys."""
    rp = cfg.get("rope_parameters") or {}
    if kind in rp or _FULL in rp or _SLIDING in rp:      # keyed by layer type (Gemma 3)
        rp = rp.get(kind) or {}
    theta = rp.get("rope_theta")
    if theta is None:
        if kind == _SLIDING and cfg.get("rope_local_base_freq") is not None:
            theta = cfg["rope_local_base_freq"]
        else:
            theta = cfg.get("rope_theta", default_theta)
    scaling = dict(rp) if rp.get("rope_type", "default") != "default" else None
    if scaling is None and cfg.get("rope_scaling") and kind == _FULL:
        scaling = cfg["rope_scaling"]                    # old Gemma 3 configs: global layers only
    scale = 1.0
    if scaling:
        rtype = scaling.get("rope_type", scaling.get("type", "default"))
        if rtype == "linear":
            scale = float(scaling["factor"])
        elif rtype != "default":
            raise ModelFormatError(f"RoPE type {rtype!r} is not supported (only default and linear)")
    return float(theta), scale


def _eos(value) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))


def _layers(types: list[str], window: int | None, thetas: dict, rope_full: bool = True) -> tuple[LayerSpec, ...]:
    out = []
    for i, t in enumerate(types):
        if t not in (_FULL, _SLIDING):
            raise ModelFormatError(f"layer {i}: unsupported layer type {t!r}")
        sliding = t == _SLIDING
        if sliding and not window:
            raise ModelFormatError(f"layer {i}: sliding layer but the config has no sliding_window")
        theta, scale = thetas[t]
        out.append(LayerSpec(index=i, kind="sliding" if sliding else "full",
                             window=int(window) if sliding else None,
                             rope=sliding or rope_full, rope_theta=theta, rope_scale=scale))
    return tuple(out)


def spec_from_hf_config(cfg: dict, max_context: int | None = None) -> ModelSpec:
    """A `ModelSpec` from a HF `config.json` dict (Gemma 3, Cohere2, Llama/Qwen2/Mistral)."""
    mtype = cfg.get("model_type", "")
    top = cfg
    if mtype == "gemma3" and "text_config" in cfg:      # multimodal wrapper: the text tower
        cfg = dict(cfg["text_config"] or {}, model_type="gemma3_text")
        mtype = "gemma3_text"
    n = cfg.get("num_hidden_layers")
    if not n:
        raise ModelFormatError(f"config of type {mtype!r} has no num_hidden_layers")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads") or heads)
    ctx = int(max_context or cfg.get("max_position_embeddings") or 8192)

    if mtype in ("gemma3_text", "gemma3"):
        head_dim = int(cfg.get("head_dim") or 256)
        types = cfg.get("layer_types") or _layer_types(n, int(cfg.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN)))
        thetas = {_SLIDING: _rope_params(cfg, _SLIDING, GEMMA3_LOCAL_BASE),
                  _FULL: _rope_params(cfg, _FULL, GEMMA3_GLOBAL_BASE)}
        if cfg.get("use_bidirectional_attention"):
            raise ModelFormatError("Gemma 3 with bidirectional attention is not a causal LM")
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ModelFormatError(f"Gemma 3 activation {act!r} is not supported")
        eos = _eos(cfg.get("eos_token_id", top.get("eos_token_id", 1)))
        return ModelSpec(
            architecture="gemma3", vocab_size=int(cfg.get("vocab_size", 262_208)), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=head_dim, max_context=ctx, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            layers=_layers(types, cfg.get("sliding_window", 4096), thetas),
            tie_embeddings=bool(top.get("tie_word_embeddings", cfg.get("tie_word_embeddings", True))),
            bos_token_id=cfg.get("bos_token_id", 2), eos_token_ids=eos,
            embed_scale=math.sqrt(hidden),
            query_scale=float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
            final_logit_softcap=cfg.get("final_logit_softcapping"),
            # Gemma 3 replaced attention soft-capping with qk-norm: transformers (and llama.cpp)
            # ignore `attn_logit_softcapping` for it even when a config sets it, and so do we.
            attn_logit_softcap=None,
            activation="gelu_tanh", norm="rms", qk_norm=True, sandwich_norm=True,
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    if mtype == "cohere2":
        types = cfg.get("layer_types") or _layer_types(n, int(cfg.get("sliding_window_pattern", COHERE2_SLIDING_PATTERN)))
        theta, scale = _rope_params(cfg, _SLIDING, 10_000.0)
        return ModelSpec(
            architecture="cohere2", vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=hidden // heads,          # Cohere2's config forces this
            max_context=ctx, norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            # full layers are NoPE: no rotation at all
            layers=_layers(types, cfg.get("sliding_window"), {_SLIDING: (theta, scale), _FULL: (theta, scale)},
                           rope_full=False),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos(cfg.get("eos_token_id")),
            logit_scale=float(cfg.get("logit_scale", 0.0625)),
            activation=_act(cfg.get("hidden_act", "silu")), norm="layernorm",
            parallel_block=True, rope_interleaved=True,
            attention_bias=bool(cfg.get("attention_bias", False)),
        )

    if mtype in ("llama", "qwen2", "mistral"):
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        window = cfg.get("sliding_window")
        types = cfg.get("layer_types")
        if not types:
            if mtype == "mistral" and window:
                types = [_SLIDING] * n
            elif mtype == "qwen2" and cfg.get("use_sliding_window") and window:
                mwl = int(cfg.get("max_window_layers", n))
                types = [_SLIDING if i >= mwl else _FULL for i in range(n)]
            else:
                types = [_FULL] * n
        rope = _rope_params(cfg, _FULL, 10_000.0)
        return ModelSpec(
            architecture=mtype, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]), num_heads=heads, num_kv_heads=kv,
            head_dim=head_dim, max_context=ctx, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            layers=_layers(types, window, {_SLIDING: rope, _FULL: rope}),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_token_id=cfg.get("bos_token_id"), eos_token_ids=_eos(cfg.get("eos_token_id")),
            activation=_act(cfg.get("hidden_act", "silu")),
            # Qwen2 always has q/k/v biases, whatever the config says
            attention_bias=mtype == "qwen2" or bool(cfg.get("attention_bias", False)),
        )
    raise ModelFormatError(f"unsupported model_type {mtype!r} (gemma3, cohere2, llama, qwen2, mistral)")


def _act(name: str) -> str:
    if name in ("silu", "swish"):
        return "silu"
    if name in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise ModelFormatError(f"activation {name!r} is not supported")


# ----------------------------------------------------------------------------- GGUF
def _open(reader_or_path):
    if isinstance(reader_or_path, (str, Path)):
        from muser.model.gguf_file import GGUFFile
        return GGUFFile(reader_or_path)
    return reader_or_path


def gguf_meta(reader, key: str, default=None):
    """One metadata value from a `GGUFFile` or a `gguf.GGUFReader`."""
    fields = reader.fields
    if key not in fields:
        return default
    f = fields[key]
    if hasattr(f, "contents"):                 # gguf.GGUFReader's ReaderField
        return f.contents()
    return f


def spec_from_gguf(reader_or_path, max_context: int | None = None) -> ModelSpec:
    """A `ModelSpec` from a GGUF header: gemma3, and llama/qwen2-style archs (all full attention)."""
    r = _open(reader_or_path)
    arch = gguf_meta(r, "general.architecture")

    def m(key, default=None):
        return gguf_meta(r, f"{arch}.{key}", default)

    n, hidden = m("block_count"), m("embedding_length")
    heads = m("attention.head_count")
    if None in (n, hidden, heads):
        raise ModelFormatError(f"GGUF of arch {arch!r} lacks block_count / embedding_length / head_count")
    kv = m("attention.head_count_kv", heads)
    head_dim = m("attention.key_length", hidden // heads)
    names = {t.name for t in r.tensors}
    # ggml order: token_embd is [ne0 = hidden, ne1 = vocab]
    vocab = m("vocab_size") or next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    ctx = int(max_context or m("context_length", 8192))
    bos = gguf_meta(r, "tokenizer.ggml.bos_token_id")
    eos = _eos(gguf_meta(r, "tokenizer.ggml.eos_token_id"))
    common = dict(vocab_size=int(vocab), hidden_size=int(hidden), intermediate_size=int(m("feed_forward_length")),
                  num_heads=int(heads), num_kv_heads=int(kv), head_dim=int(head_dim), max_context=ctx,
                  norm_eps=float(m("attention.layer_norm_rms_epsilon", 1e-6)),
                  tie_embeddings="output.weight" not in names, bos_token_id=bos)
    if arch == "gemma3":
        # The GGUF has no pattern and no local base: Gemma 3's conventions, as transformers does.
        thetas = {_SLIDING: (GEMMA3_LOCAL_BASE, 1.0), _FULL: (float(m("rope.freq_base", GEMMA3_GLOBAL_BASE)), 1.0)}
        rs = m("rope.scaling.type")
        if rs == "linear":
            thetas[_FULL] = (thetas[_FULL][0], float(m("rope.scaling.factor")))
        if not eos:
            eos = (1,)
        eos = tuple(dict.fromkeys(eos + (1, GEMMA3_END_OF_TURN)))
        # query_pre_attn_scalar is not in the file: head_dim for 270M..12B; 27B (62 layers) uses
        # hidden / heads -- llama.cpp's rule, which keys on the layer count the same way.
        qpas = hidden / heads if int(n) == 62 else head_dim
        pattern = m("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
        if isinstance(pattern, int):
            types = _layer_types(int(n), pattern)
        else:                                   # newer converters: one flag per layer, true = sliding
            types = [_SLIDING if bool(x) else _FULL for x in pattern]
        return ModelSpec(architecture="gemma3", layers=_layers(types, m("attention.sliding_window"), thetas),
                         eos_token_ids=eos, embed_scale=math.sqrt(hidden), query_scale=float(qpas) ** -0.5,
                         final_logit_softcap=m("final_logit_softcapping"),   # no attention cap: see above
                         activation="gelu_tanh", norm="rms", qk_norm=True, sandwich_norm=True, **common)
    if arch in ("llama", "qwen2", "mistral"):
        rope = (float(m("rope.freq_base", 10_000.0)), 1.0)
        if m("rope.scaling.type") == "linear":
            rope = (rope[0], float(m("rope.scaling.factor")))
        elif m("rope.scaling.type") not in (None, "none"):
            raise ModelFormatError(f"RoPE scaling {m('rope.scaling.type')!r} is not supported")
        window = m("attention.sliding_window")
        types = [_SLIDING if window else _FULL] * int(n)
        return ModelSpec(architecture=arch, layers=_layers(types, window, {_SLIDING: rope, _FULL: rope}),
                         eos_token_ids=eos, attention_bias="blk.0.attn_q.bias" in names, **common)
    raise ModelFormatError(f"GGUF architecture {arch!r} is not supported (gemma3, llama, qwen2)")
