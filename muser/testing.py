"""Tiny real models for tests and examples: random weights, a real trained tokenizer.

Owns: `tiny_model_dir(...)` (a Hugging Face model directory written by transformers' own
`save_pretrained`, with a small BPE tokenizer trained by `tokenizers` and a Gemma-style chat
template) and `tiny_model(...)` (the same, loaded as a muser Engine); `q8_0_head_dir(...)` (a
copy whose head holds Q8_0 values).  Directories are cached per argument set for the life of the
process; `prompt_ids(...)` (seeded token ids for such a model) and `continue_both(s1, s2)` (the
same calls on two sessions, every logit and the caches compared bitwise).  Does not own: anything
the engine needs at run time.
"""
from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

CORPUS = (
    "the quick brown fox jumps over the lazy dog. hybrid attention mixes sliding windows "
    "with full layers. a ring keeps the last tokens; a growing plane keeps them all. "
    "def add(a, b):\n    return a + b\n# comments explain the why. 0 1 2 3 4 5 6 7 8 9 "
    "user model system assistant hello world! how are you? fine, thanks. "
) * 4
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ '<start_of_turn>system\n' + "
    "m['content'] + '<end_of_turn>\n' }}{% else %}{{ '<start_of_turn>' + ('model' if m['role'] == "
    "'assistant' else m['role']) + '\n' + m['content'] + '<end_of_turn>\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)


# gpt-oss's harmony format, compactly (system, developer instructions, turns, generation
# prompt); the released template adds tools, dates and channel handling on the same frame.
HARMONY_SPECIALS = ["<|start|>", "<|message|>", "<|end|>", "<|channel|>", "<|return|>", "<|call|>",
                    "<|constrain|>", "<|endoftext|>"]
HARMONY_TEMPLATE = (
    "{{- '<|start|>system<|message|>You are a helpful assistant.\\nReasoning: ' + (reasoning_effort | "
    "default('medium')) + '\\n\\n# Valid channels: analysis, commentary, final. Channel must be included "
    "for every message.<|end|>' -}}"
    "{%- set msgs = messages -%}"
    "{%- if messages and messages[0]['role'] in ('system', 'developer') -%}"
    "{{- '<|start|>developer<|message|># Instructions\\n\\n' + messages[0]['content'] + '<|end|>' -}}"
    "{%- set msgs = messages[1:] -%}{%- endif -%}"
    "{%- for m in msgs -%}{%- if m['role'] == 'assistant' -%}"
    "{{- '<|start|>assistant<|channel|>final<|message|>' + m['content'] + '<|end|>' -}}"
    "{%- else -%}{{- '<|start|>' + m['role'] + '<|message|>' + m['content'] + '<|end|>' -}}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)


def _write_tokenizer(path: Path, vocab: int, harmony: bool = False) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS + (HARMONY_SPECIALS if harmony else []),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    fast.chat_template = HARMONY_TEMPLATE if harmony else CHAT_TEMPLATE
    fast.save_pretrained(path)


@functools.lru_cache(maxsize=None)
def tiny_model_dir(arch: str = "gemma3", layers: int = 6, window: int = 4, vocab: int = 384,
                   hidden: int = 64, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                   max_context: int = 256, seed: int = 0, tokenizer: bool = True) -> Path:
    import torch
    import transformers as tr
    path = Path(tempfile.mkdtemp(prefix=f"muser-tiny-{arch}-"))
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  head_dim=head_dim, max_position_embeddings=max_context, sliding_window=window,
                  pad_token_id=0, eos_token_id=1, bos_token_id=2, tie_word_embeddings=True)
    if arch == "gemma3":
        types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)]
        cfg = tr.Gemma3TextConfig(layer_types=types, query_pre_attn_scalar=head_dim,
                                  rope_theta=10000.0, **common)
        model = tr.Gemma3ForCausalLM(cfg)
    elif arch == "cohere2":
        types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)]
        common.pop("head_dim")
        cfg = tr.Cohere2Config(layer_types=types, logit_scale=0.5, **common)
        model = tr.Cohere2ForCausalLM(cfg)
    elif arch == "llama":
        common.pop("sliding_window")
        model = tr.LlamaForCausalLM(tr.LlamaConfig(**common))
    elif arch in FAMILIES:
        model = _family_model(tr, arch, common, layers, window, head_dim)
    else:
        raise ValueError(f"arch must be one of gemma3, cohere2, llama, {', '.join(FAMILIES)}; got {arch!r}")
    # Random init leaves some norms at exactly 0 / 1 (and biases, sinks, scales at 0 / 1);
    # perturb so parity tests see every weight.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "scale" in name:
                p.add_(0.1 * torch.randn_like(p))
            elif name.endswith("bias") or name.endswith("sinks"):
                p.normal_(0, 0.3)
        for layer in getattr(getattr(model, "model", None), "layers", []):
            if hasattr(layer, "layer_scalar"):                 # Gemma 4: a buffer, not a parameter
                layer.layer_scalar.fill_(0.8 + 0.4 * torch.rand(()).item())
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer:
        _write_tokenizer(path, vocab, harmony=arch == "gpt_oss")
    (path / "muser-tiny.json").write_text(json.dumps({"arch": arch, "seed": seed}))
    return path


# The 2025-26 hybrid families (issue 16), tiny: every feature of the family switched on.
FAMILIES = ("gpt_oss", "gemma4", "gemma4_moe", "olmo3", "exaone4", "ministral")

# openai/gpt-oss-20b's config.json as published (the fields the layer map reads): `cache-plan`
# tests and the real-shape GPU benchmark (benchmarks/families_cuda_bench.py).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "rms_norm_eps": 1e-05, "sliding_window": 128, "swiglu_limit": 7.0,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
                     "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "tie_word_embeddings": False, "vocab_size": 201088, "eos_token_id": 200002,
    "pad_token_id": 199999, "quantization_config": {"quant_method": "mxfp4"},
}


def _family_model(tr, arch: str, common: dict, layers: int, window: int, head_dim: int):
    c = dict(common)
    if arch == "gpt_oss":
        # 1:1 sliding / full, sinks, YaRN (short original context so the ramp is exercised), 4 experts top-2
        c.pop("pad_token_id")
        cfg = tr.GptOssConfig(num_local_experts=4, num_experts_per_tok=2, **dict(c, intermediate_size=32),
                              rope_parameters={"rope_type": "yarn", "factor": 8.0, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False, "rope_theta": 150000.0,
                                               "original_max_position_embeddings": 32})
        return tr.GptOssForCausalLM(cfg)
    if arch in ("gemma4", "gemma4_moe"):
        # 2:1 sliding / full (last layer full), 2x-wide global heads with one kv head and V = K,
        # proportional RoPE on global layers, per-layer inputs, the last third KV-shared
        types = ["full_attention" if (i + 1) % 3 == 0 else "sliding_attention" for i in range(layers)]
        moe = dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=24) \
            if arch == "gemma4_moe" else {}
        cfg = tr.Gemma4TextConfig(layer_types=types, global_head_dim=2 * head_dim, attention_k_eq_v=True,
                                  num_global_key_value_heads=1, hidden_size_per_layer_input=8,
                                  vocab_size_per_layer_input=c["vocab_size"], num_kv_shared_layers=layers // 3,
                                  final_logit_softcapping=30.0, **moe, **c)
        return tr.Gemma4ForCausalLM(cfg)
    c.pop("head_dim") if arch in ("olmo3", "exaone4") else None
    if arch == "olmo3":
        # 3:1 sliding / full, post-norms only, qk-norm over all heads, YaRN on full layers
        cfg = tr.Olmo3Config(rope_scaling={"rope_type": "yarn", "factor": 8.0, "attention_factor": 1.1,
                                           "original_max_position_embeddings": 32}, **c)
        return tr.Olmo3ForCausalLM(cfg)
    if arch == "exaone4":
        # 3:1 sliding / full, NoPE full layers, post-norms only, per-head qk-norm
        return tr.Exaone4ForCausalLM(tr.Exaone4Config(sliding_window_pattern=4, **c))
    # ministral: Ministral's interleaved sliding / full pattern
    types = ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(layers)]
    return tr.MinistralForCausalLM(tr.MinistralConfig(layer_types=types, **c))


def q8_0_values(w, dtype=None):
    """w rounded to Q8_0 blocks, in `dtype` (default w's): a weight as a GGUF stores it as Q8_0
    and a loader casts it -- what CUDA's default keeps as its blocks (defaults.default_head)."""
    from .backends.cuda.weights_int8 import quantize_blocks
    return quantize_blocks(w.float()).dequantized().to(dtype or w.dtype)


@functools.lru_cache(maxsize=None)
def q8_0_head_dir(**kw) -> Path:
    """A copy of `tiny_model_dir(**kw)` whose (tied) head holds Q8_0 values, as the embedded
    270M's does (its GGUF stores the head as Q8_0 blocks): the CUDA default then runs it as
    quant="int8-head" (backends/defaults.default_head).  A copy, so the cached directory of the
    same arguments keeps its random head."""
    import shutil
    from safetensors.torch import load_file, save_file
    path = Path(tempfile.mkdtemp(prefix="muser-tiny-q8-head-")) / "model"
    shutil.copytree(tiny_model_dir(**kw), path)
    f = next(path.glob("*.safetensors"))
    tensors = load_file(f)
    key = next(k for k in tensors if k.endswith("embed_tokens.weight"))
    tensors[key] = q8_0_values(tensors[key])
    save_file(tensors, f, metadata={"format": "pt"})
    return path


def tiny_model(arch: str = "gemma3", device: str = "cpu", dtype: str = "float32",
               backend: str = "ring", chunk_size: int = 512, quant: str = "none", **kw):
    from .engine import load
    return load(str(tiny_model_dir(arch, **kw)), device=device, dtype=dtype, backend=backend,
                chunk_size=chunk_size, quant=quant, progress=False)


def prompt_ids(n: int, seed: int = 0, vocab: int = 384) -> list[int]:
    """n token ids in [3, vocab) from a seeded generator (0-2: the tiny tokenizer's specials)."""
    import torch
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# (call, argument, chunk size): prefills in odd chunks, decodes and a verification block
CONTINUE_STEPS = (("prefill", (5, 1), 2), ("decode", 17, None), ("extend", (6, 2), None),
                  ("decode", 9, None), ("prefill", (9, 3), 4), ("decode", 5, None))


def continue_both(s1, s2) -> None:
    """Feed the same calls (CONTINUE_STEPS) to two sessions: every logit bitwise equal, then
    their snapshots (every K/V row and the bookkeeping) equal."""
    import torch
    for kind, arg, chunk in CONTINUE_STEPS:
        x = arg if kind == "decode" else prompt_ids(*arg)     # a token, or (n, seed) of ids
        kw = {"chunk_size": chunk} if kind == "prefill" else {}
        o1, o2 = getattr(s1, kind)(x, **kw), getattr(s2, kind)(x, **kw)
        assert torch.equal(o1, o2), f"{kind} diverged"
    assert s1.snapshot().equal(s2.snapshot())
