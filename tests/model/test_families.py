"""The 2025-26 hybrid families against transformers, model level: the layer map each config
yields, RoPE schedules, attention sinks, experts and MXFP4 -- each checked against transformers'
own code on tiny random checkpoints."""
from __future__ import annotations

import json

import pytest
import torch

from muser.model.safetensors_loader import load_hf_dir
from muser.model.transformer import forward_reference
from muser.testing import FAMILIES, tiny_model_dir

transformers = pytest.importorskip("transformers")
T = 40


def _hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


@pytest.mark.parametrize("arch", FAMILIES)
def test_forward_reference_matches_transformers(arch):
    path = tiny_model_dir(arch, window=5, tokenizer=False)
    spec, weights = load_hf_dir(path)
    ids = torch.randint(0, 384, (T,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = _hf(path)(ids[None]).logits[0]
    got = forward_reference(weights, spec, ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _kinds(spec):
    return "".join("S" if l.kind == "sliding" else "F" for l in spec.layers)


def test_layer_maps_of_each_family():
    """What each config's details become in the layer map (spec.layers) -- decided only in spec.py."""
    g = load_hf_dir(tiny_model_dir("gpt_oss", layers=4, window=5, tokenizer=False))[0]
    assert _kinds(g) == "SFSF" and g.attention_sinks and g.moe.style == "gpt_oss" and g.attention_bias
    assert all(l.rope and l.rope_scaling.kind == "yarn" and l.rope_scaling.factor == 8.0
               and not l.rope_scaling.truncate for l in g.layers)

    o = load_hf_dir(tiny_model_dir("olmo3", layers=8, window=5, tokenizer=False))[0]
    assert _kinds(o) == "SSSFSSSF" and not o.pre_norm and o.qk_norm_span == "all"
    assert [l.rope_scaling is not None for l in o.layers] == [l.kind == "full" for l in o.layers]  # YaRN: full only

    x = load_hf_dir(tiny_model_dir("exaone4", layers=8, window=5, tokenizer=False))[0]
    assert _kinds(x) == "SSSFSSSF" and not x.pre_norm and x.qk_norm_span == "head"
    assert [l.rope for l in x.layers] == [l.kind == "sliding" for l in x.layers]              # NoPE globals

    m = load_hf_dir(tiny_model_dir("ministral", layers=4, window=5, tokenizer=False))[0]
    assert _kinds(m) == "SFSF" and m.pre_norm and not m.qk_norm

    spec = load_hf_dir(tiny_model_dir("gemma4", layers=6, window=5, tokenizer=False))[0]
    assert _kinds(spec) == "SSFSSF" and spec.query_scale == 1.0 and spec.v_norm and spec.per_layer_input == 8
    assert [(l.head_dim, l.kv_heads, l.k_eq_v) for l in spec.layers] == \
        [(16, 2, False), (16, 2, False), (32, 1, True)] * 2
    assert [l.kv_source for l in spec.layers] == [None, None, None, None, 3, 2]          # last third shared
    full = spec.layers[2].rope_scaling
    assert full.kind == "proportional" and full.partial == 0.25 and spec.layers[0].rope_scaling is None


@pytest.mark.parametrize("cfg, kinds", [
    ({"sliding_window": 8, "sliding_window_pattern": "LLLG"}, "SSSFSSSF"),
    ({"sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 4}, "SFSFSFSF"),
    ({"sliding_window": None}, "FFFFFFFF"),
])
def test_exaone4_patterns(cfg, kinds):
    from muser.model.spec import spec_from_hf_config
    base = dict(model_type="exaone4", num_hidden_layers=8, hidden_size=64, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=100, intermediate_size=128)
    spec = spec_from_hf_config(dict(base, **cfg))
    assert _kinds(spec) == kinds
    assert all(l.rope == (l.kind == "sliding" or not cfg["sliding_window"]) for l in spec.layers)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
     "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 500000.0,
     "attention_factor": 1.2},
    {"rope_type": "llama3", "factor": 16.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
     "original_max_position_embeddings": 8192, "rope_theta": 1000000.0},
])
def test_rope_schedules_equal_transformers(rope):
    """Inverse frequencies and amplitude bitwise equal to transformers' ROPE_INIT_FUNCTIONS."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from muser.model.rope import inv_freq
    from muser.model.spec import spec_from_hf_config
    cfg = LlamaConfig(hidden_size=512, num_attention_heads=8, head_dim=64, rope_parameters=dict(rope),
                      max_position_embeddings=131072)
    want, want_amp = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
    ls = spec_from_hf_config(dict(json.loads(cfg.to_json_string()), vocab_size=10, num_hidden_layers=1,
                                  intermediate_size=8)).layers[0]
    got, amp = inv_freq(ls.rope_theta, ls.rope_scale, ls.rope_scaling, 64)
    assert torch.equal(got, want.float()) and amp == pytest.approx(want_amp, rel=0, abs=0)


def test_proportional_rope_equals_transformers_gemma4():
    from transformers import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
    from muser.model.rope import inv_freq
    from muser.model.spec import spec_from_hf_config
    cfg = Gemma4TextConfig(num_hidden_layers=6, hidden_size=64, head_dim=16, global_head_dim=512,
                           num_attention_heads=2, num_key_value_heads=1, vocab_size=100)
    hf = Gemma4TextRotaryEmbedding(cfg)
    spec = spec_from_hf_config(json.loads(cfg.to_json_string()))
    for ls in (spec.layers[0], spec.layers[5]):
        t = "full_attention" if ls.kind == "full" else "sliding_attention"
        got, _ = inv_freq(ls.rope_theta, ls.rope_scale, ls.rope_scaling, ls.head_dim)
        assert torch.equal(got, getattr(hf, f"{t}_inv_freq"))
    assert spec.layers[5].head_dim == 512 and int((inv_freq(1e6, 1.0, spec.layers[5].rope_scaling, 512)[0] > 0)
                                                  .sum()) == 64   # a quarter of 256 angles rotate


def test_sinks_equal_transformers_eager_attention():
    """The reference attention's sinks == gpt-oss's eager attention (sliding mask and full)."""
    from types import SimpleNamespace
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward
    from muser.attention.reference import attention, visibility_mask
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(9, 4, 8, generator=g), torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    sinks = torch.randn(4, generator=g) * 2
    pos = torch.arange(9)
    for window in (None, 3):
        mask = visibility_mask(pos, pos, window)
        add = torch.zeros(9, 9).masked_fill(~mask, float("-inf"))[None, None]
        mod = SimpleNamespace(num_key_value_groups=2, sinks=sinks, training=False)
        want = eager_attention_forward(mod, q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                       v.transpose(0, 1)[None], add, 0.3)[0][0]
        torch.testing.assert_close(attention(q, k, v, mask, 0.3, sinks=sinks), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows, window", [(1, None), (5, 3), (80, None), (80, 17)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_cpu_attention_path_takes_sinks(rows, window, dtype):
    """Decode (all visible), short chunks (reference) and long chunks (fused kernel + its
    log-sum-exp) agree with the reference with sinks."""
    from muser.backends.cpu.attention import CpuAttention
    from muser.attention.reference import attention, visibility_mask
    g = torch.Generator().manual_seed(rows)
    S = rows + 40
    q = torch.randn(rows, 8, 64, generator=g).to(dtype)
    k, v = (torch.randn(S, 2, 64, generator=g).to(dtype) for _ in range(2))
    sinks = torch.randn(8, generator=g) * 3
    qpos, kpos = torch.arange(S - rows, S), torch.arange(S)
    mask = visibility_mask(qpos, kpos, window)
    want = attention(q, k, v, mask, 0.125, sinks=sinks).float()
    got = CpuAttention()(q, k, v, None if rows == 1 and window is None else mask, 0.125, None, sinks=sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    without = attention(q, k, v, mask, 0.125).float()
    assert (without - want).abs().max() > 0.1                                        # the sinks mattered


@pytest.mark.parametrize("rows, keys, window, rotation", [(1, 40, None, 0), (5, 300, 17, 0), (70, 600, None, 0),
                                                         (1, 128, 128, 77)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_positional_kernel_takes_sinks(rows, keys, window, rotation, dtype):
    """csrc/attend.c with sinks (joined in its merge) == the reference, for decode rows, chunks,
    windows and a rotated ring read in place."""
    from muser.attention.reference import attention, visibility_mask
    from muser.model import native
    if not native.available():
        pytest.skip("no C compiler")
    g = torch.Generator().manual_seed(rows)
    q = torch.randn(rows, 8, 64, generator=g).to(dtype)
    k, v = (torch.randn(keys, 2, 64, generator=g).to(dtype) for _ in range(2))
    sinks = torch.randn(8, generator=g) * 3
    first = 500 if rotation else keys - rows                  # ring: positions 500-127 .. 500 + rows - 1
    pos0 = first + rows - keys
    slots = (torch.arange(keys) + rotation) % keys              # key position pos0 + j lives in row slots[j]
    ring_k, ring_v = torch.empty_like(k), torch.empty_like(v)
    ring_k[slots], ring_v[slots] = k, v
    got = native.attend_rows(q, ring_k, ring_v, first, window, pos0, 0.125, rotation=rotation, sinks=sinks)
    mask = visibility_mask(torch.arange(first, first + rows), torch.arange(pos0, pos0 + keys), window)
    want = attention(q, k, v, mask, 0.125, sinks=sinks)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def test_mxfp4_experts_equal_transformers_dequantization():
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from muser.model.dequant import mxfp4_hf
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), dtype=torch.uint8, generator=g)
    scales = torch.randint(100, 150, (3, 10, 4), dtype=torch.uint8, generator=g)
    want = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)        # [E, in, out]
    assert torch.equal(mxfp4_hf(blocks, scales), want.transpose(1, 2))


def test_gpt_oss_mxfp4_checkpoint_loads_like_its_dequantized_twin(tmp_path):
    """A gpt-oss checkpoint with MXFP4 `_blocks`/`_scales` experts (as released) gives the
    logits of the same checkpoint with the dequantized experts written out."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    src = tiny_model_dir("gpt_oss", layers=2, window=5, tokenizer=False)
    sd = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(3)
    packed, plain = dict(sd), dict(sd)
    for key in [k for k in sd if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]:
        E, din, dout = sd[key].shape                              # [E, in, out]
        blocks = torch.randint(0, 256, (E, dout, din // 32, 16), dtype=torch.uint8, generator=g)
        scales = torch.randint(118, 124, (E, dout, din // 32), dtype=torch.uint8, generator=g)
        del packed[key]
        packed[key + "_blocks"], packed[key + "_scales"] = blocks, scales
        plain[key] = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).contiguous()
    for name, sd_ in (("packed", packed), ("plain", plain)):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text((src / "config.json").read_text())
        save_file(sd_, str(d / "model.safetensors"))
    ids = torch.arange(20) * 7 % 384
    sa, wa = load_hf_dir(tmp_path / "packed")
    sb, wb = load_hf_dir(tmp_path / "plain")
    assert torch.equal(forward_reference(wa, sa, ids), forward_reference(wb, sb, ids))
    with torch.no_grad():
        want = _hf(tmp_path / "plain")(ids[None]).logits[0]
    torch.testing.assert_close(forward_reference(wa, sa, ids), want, rtol=1e-4, atol=1e-4)


def test_experts_give_each_token_the_bits_it_gets_alone():
    """A token's MoE output does not depend on the other tokens of the step: int8 experts
    (the CPU default) give it the bits it gets alone; float experts, in a short chunk of a
    given size, the same bits whatever the other rows are and wherever they are routed."""
    from muser.model import moe
    from muser.model.quantize import quantize_weights
    spec, w = load_hf_dir(tiny_model_dir("gpt_oss", layers=2, window=5, tokenizer=False))
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, spec.hidden_size, generator=g)
    other = torch.randn(12, spec.hidden_size, generator=g)

    def run(mw, rows):
        return moe.experts(mw, spec.moe, rows, *moe.route(mw, spec.moe, rows))

    mw = quantize_weights(w.to(None, torch.bfloat16)).layers[0].moe
    xb = x.to(torch.bfloat16)
    both = run(mw, xb)
    for t in (0, 5, 11):
        assert torch.equal(both[t:t + 1], run(mw, xb[t:t + 1]))
    mw = w.layers[0].moe
    both = run(mw, x)
    for t in (0, 5, 11):
        mixed = other.clone()
        mixed[t] = x[t]
        assert torch.equal(both[t], run(mw, mixed)[t])


def test_harmony_chat_template_and_its_stop_tokens():
    """gpt-oss chats through its tokenizer's template (harmony); <|end|> closes a message but
    not the turn, so only <|return|> and <|call|> (and the tokenizer's EOS) stop generation."""
    from muser.model.tokenizer import load_tokenizer
    from muser.testing import HARMONY_SPECIALS
    tok = load_tokenizer(tiny_model_dir("gpt_oss", window=5))
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "fox?"}]
    text = tok.render_chat(msgs)
    assert text.startswith("<|start|>system<|message|>") and text.endswith(
        "<|start|>developer<|message|># Instructions\n\nbe brief<|end|>"
        "<|start|>user<|message|>hello world<|end|>"
        "<|start|>assistant<|channel|>final<|message|>hi<|end|>"
        "<|start|>user<|message|>fox?<|end|><|start|>assistant")
    ids = tok.apply_chat_template(msgs)
    special = {s: tok.token_id(s) for s in HARMONY_SPECIALS}
    assert ids[0] == special["<|start|>"] and ids.count(special["<|end|>"]) == 5
    assert tok.harmony and special["<|return|>"] in tok.eos_token_ids and special["<|call|>"] in tok.eos_token_ids
    assert special["<|end|>"] not in tok.eos_token_ids


def test_gemma4_multimodal_config_and_prefix(tmp_path):
    """A `gemma4` config with text_config and tensors under model.language_model. (the released
    multimodal checkpoints): the text tower loads, vision/audio tensors are skipped."""
    from safetensors.torch import load_file, save_file
    src = tiny_model_dir("gemma4", layers=6, window=5, tokenizer=False)
    sd = {k.replace("model.", "model.language_model.", 1): v for k, v in load_file(str(src / "model.safetensors")).items()}
    sd["model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"] = torch.zeros(4, 4)
    sd["model.audio_tower.layers.0.weight"] = torch.zeros(4)
    save_file(sd, str(tmp_path / "model.safetensors"))
    text = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": text,
                                                      "tie_word_embeddings": True}))
    spec, weights = load_hf_dir(tmp_path)
    ref_spec, ref_weights = load_hf_dir(src)
    assert spec == ref_spec
    ids = torch.arange(T) * 5 % 384
    assert torch.equal(forward_reference(weights, spec, ids), forward_reference(ref_weights, ref_spec, ids))


@pytest.mark.parametrize("variant", [
    dict(attention_k_eq_v=False, use_double_wide_mlp=True, num_kv_shared_layers=2, hidden_size_per_layer_input=4),
    # (transformers itself cannot run KV sharing without per-layer inputs: its slicing indexes them)
    dict(attention_k_eq_v=False, num_kv_shared_layers=0, hidden_size_per_layer_input=0, global_head_dim=16),
])
def test_gemma4_variants_match_transformers(variant, tmp_path):
    """Gemma 4 without V = K (own V projection on global layers), with the double-wide MLP of
    KV-shared layers, without per-layer inputs, without sharing."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    kw = dict(dict(global_head_dim=32), **variant)
    cfg = Gemma4TextConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                           layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                           vocab_size_per_layer_input=300, max_position_embeddings=256,
                           attn_implementation="eager", **kw)
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    spec, weights = load_hf_dir(tmp_path)
    ids = torch.randint(0, 300, (T,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids[None]).logits[0]
    torch.testing.assert_close(forward_reference(weights, spec, ids), want, rtol=1e-4, atol=1e-4)
