"""`muser cache-plan` for the 2025-26 families, from config.json alone (no weights)."""
import json
from types import SimpleNamespace

from muser.testing import GPT_OSS_20B


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
