"""`muser cache-plan` for the 2025-26 families, from config.json alone (no weights)."""
import json
from types import SimpleNamespace

# openai/gpt-oss-20b's config.json as published (the fields the layer map reads).
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


def muser(capsys, *args):
    """The CLI's argument parsing and command, in process (test_generate_cli runs the real process)."""
    from muser.cli.main import build_parser
    a = build_parser().parse_args(list(args))
    rc = a.func(a)
    return SimpleNamespace(returncode=rc, stdout=capsys.readouterr().out, stderr="")


def test_gpt_oss_20b_at_131072_tokens(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(GPT_OSS_20B))
    r = muser(capsys, "cache-plan", str(tmp_path), "--context", "131072")
    assert r.returncode == 0, r.stderr
    # K+V of one token in one layer, bf16: 2 x 8 kv heads x 64 x 2 B = 2,048 B
    assert "12 sliding + 12 full layers" in r.stdout and "row 2048 B" in r.stdout
    assert f"{12 * 128 * 2048:,} B" in r.stdout                 # 3,145,728: flat past 128 tokens
    assert f"{12 * 131072 * 2048:,} B" in r.stdout              # 3,221,225,472
    assert "shared" not in r.stdout


def test_gemma4_shaped_config_counts_shared_planes_once(tmp_path, capsys):
    """transformers' Gemma4TextConfig defaults (30 layers 5:1, window 512, 4 kv heads of 256 on
    sliding layers and of 512 on global ones) with the last 10 layers KV-shared."""
    from transformers import Gemma4TextConfig
    cfg = json.loads(Gemma4TextConfig(num_kv_shared_layers=10).to_json_string())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = muser(capsys, "cache-plan", str(tmp_path), "--context", "131072")
    assert r.returncode == 0, r.stderr
    assert "17 sliding + 3 full layers + 10 KV-shared" in r.stdout and "row 4096 / 8192 B" in r.stdout
    assert f"{17 * 512 * 4096:,} B" in r.stdout and f"{3 * 131072 * 8192:,} B" in r.stdout
    assert f"saves {8 * 512 * 4096 + 2 * 131072 * 8192:,} B" in r.stdout
