"""benchmarks/llama_cuda_peer.py: llama.cpp's CUDA build as cuda_bench's side-by-side peer.  What
runs here is the harness -- the converter staging, the commands, the parsers -- against stand-in
executables that check their arguments; the figures themselves come from the GPU machine."""
import json
import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import llama_cuda_peer as peer  # noqa: E402

BATCHED = """main: n_kv_max = 40960, n_batch = 2048, n_ubatch = 512, flash_attn = 1

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|  2048 |    128 |    1 |   2176 |    0.061 | 33575.89 |    0.287 |   446.01 |    0.348 |  6252.87 |
|  2048 |    128 |   16 |  34816 |    0.921 | 35578.02 |    0.594 |  3449.16 |    1.515 | 22981.52 |
"""


def rows(*specs):
    return [{"n_prompt": p, "n_gen": g, "n_depth": d, "avg_ts": ts, "stddev_ts": 1.0}
            for p, g, d, ts in specs]


def test_bench_json_is_found_among_log_lines_and_summarized():
    text = "[INFO] loading model\nggml_cuda_init: found 1 CUDA devices\n" + json.dumps(
        rows((512, 0, 0, 50000.0), (0, 128, 2048, 500.0), (0, 128, 32768, 250.0))) + "\n"
    got = peer.summarize(peer.bench_rows(text))
    assert got == {"pp512": 50000.0, "tg_2048_ms": 2.0, "tg_32768_ms": 4.0}


def test_output_without_bench_json_is_refused():
    with pytest.raises(ValueError, match="no llama-bench JSON"):
        peer.bench_rows("[INFO] out of memory\n")


def test_the_16_sequence_row_of_batched_bench():
    assert peer.batched_tg(BATCHED) == 3449.16
    assert peer.batched_tg(BATCHED, sequences=1) == 446.01
    with pytest.raises(ValueError, match="no B = 8 row"):
        peer.batched_tg(BATCHED, sequences=8)


def _exe(path: Path, body: str):
    path.write_text("#!" + sys.executable + "\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_bench_runs_the_three_llama_bench_calls_and_the_batched_one(tmp_path):
    log = tmp_path / "calls.txt"
    _exe(tmp_path / "llama-bench", f"""import json, sys
a = sys.argv[1:]
open({str(log)!r}, "a").write(" ".join(a) + "\\n")
assert a[a.index("-ngl") + 1] == "99" and a[a.index("-fa") + 1] == "1" and a[a.index("-o") + 1] == "json"
p, n = int(a[a.index("-p") + 1]), int(a[a.index("-n") + 1])
depths = [int(d) for d in a[a.index("-d") + 1].split(",")] if "-d" in a else [0]
print(json.dumps([{{"n_prompt": p, "n_gen": n, "n_depth": d, "avg_ts": 1000.0 + d}} for d in depths]))
""")
    _exe(tmp_path / "llama-batched-bench", f"print({BATCHED!r})")
    assert peer.available(str(tmp_path)) and not peer.available(str(tmp_path / "none"))
    got = peer.bench("m.gguf", str(tmp_path), long=32768, batched=True)
    assert got == {"pp512": 1000.0, "pp16384": 1000.0, "tg_2048_ms": 1e3 / 3048.0,
                   "tg_32768_ms": 1e3 / 33768.0, "b16_tg": 3449.16}
    assert len(log.read_text().splitlines()) == 3


def test_convert_stages_the_model_with_the_tokenizer(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"x")
    tok = tmp_path / "tokenizer.model"
    tok.write_bytes(b"sp")
    src = tmp_path / "llama"
    (src / "gguf-py").mkdir(parents=True)
    (src / "convert_hf_to_gguf.py").write_text("""import os, sys
stage, out = sys.argv[1], sys.argv[sys.argv.index("--outfile") + 1]
assert sys.argv[sys.argv.index("--outtype") + 1] == "bf16"
assert sorted(os.listdir(stage)) == ["config.json", "model.safetensors", "tokenizer.model"], os.listdir(stage)
assert os.environ["PYTHONPATH"].endswith("gguf-py")
open(out, "wb").write(b"GGUF")
""")
    out = tmp_path / "m.gguf"
    assert peer.convert(str(model), str(out), str(src), str(tok)) == str(out)
    assert out.read_bytes() == b"GGUF"
    (src / "convert_hf_to_gguf.py").write_text("import sys; sys.exit('unsupported architecture')")
    with pytest.raises(RuntimeError, match="unsupported architecture"):
        peer.convert(str(model), str(tmp_path / "n.gguf"), str(src), str(tok))
    assert sorted(os.listdir(model)) == ["config.json", "model.safetensors"]   # left as it was


def test_the_side_by_side_table_puts_each_engine_in_its_column():
    import cuda_bench
    cuda_bench.LOG.clear()
    results = {"1b": {"shape": {"long": 32768}, "floor_ms": 0.475, "decode_2k": [0.00119, 0.0011],
                      "decode_32k": [0.0013, 0.0012], "hf_decode_2k": 0.02, "prefill_512": 40000.0,
                      "prefill_16k_default": 300000.0, "hf_prefill_16k": 60000.0,
                      "batch16_2k": [14000.0, 1.1], "hf_batch16_2k": 900.0,
                      "llama": {"tg_2048_ms": 2.24, "pp512": 53282.0, "pp16384": 44060.0}},
               "4b": {"shape": {"long": 32768}, "floor_ms": 1.84, "decode_2k": "ERROR x",
                      "llama": "ERROR RuntimeError: convert failed"}}
    cuda_bench.side_by_side(results)
    lines = [l for l in cuda_bench.LOG if l.startswith("| 1b") or l.startswith("| 4b")]
    assert "| 1b | decode 2k, ms/token | 1.190 | 2.240 | 20.000 | 0.475 |" in lines
    assert "| 1b | prefill 16k, tok/s | 300,000 | 44,060 | 60,000 | - |" in lines
    assert "| 1b | 16 sessions @2k, tok/s | 14,000 | - | 900 | - |" in lines
    assert not any(l.startswith("| 4b") for l in lines)          # nothing measured: no rows
