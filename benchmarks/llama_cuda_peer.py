"""llama.cpp's CUDA build as cuda_bench.py's side-by-side peer: same weights, same GPU, one run.

Owns: `convert(hf_dir, ...)` (a random-weight HF dir as cuda_bench saves it -> a bf16 GGUF with
llama.cpp's own converter; the dir has no tokenizer, so a staging dir of links plus a rebuilt
tokenizer.model, as ../shared/peers/llama-cpp-cuda/convert.sh does), `bench(gguf, ...)`
(llama-bench: prompt 512 and 16k tokens, 128 generated tokens at depth 2k and 32k; optionally
llama-batched-bench: 16 sequences of 2k prompts) and the parsers of their outputs.  Does not own:
building llama.cpp (../shared/peers/llama-cpp-cuda/build.sh, ~6 minutes on the GPU machine) or
rebuilding the tokenizer (make_tokenizer.py there).

    from llama_cuda_peer import convert, bench
    gguf = convert("/dev/shm/muser-bench-x", "/tmp/gg/1b.gguf", src="/tmp/llama-strip",
                   tokenizer="/tmp/tok/tokenizer.model")
    bench(gguf, "/tmp/lb/bin", batched=True)
    -> {"pp512": tok/s, "pp16384": tok/s, "tg_2048_ms": ms/token, "tg_32768_ms": ..., "b16_tg": tok/s}
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path


def available(bin_dir: str | None) -> bool:
    return bool(bin_dir) and os.access(os.path.join(bin_dir, "llama-bench"), os.X_OK)


def convert(hf_dir: str, out: str, src: str, tokenizer: str, timeout: int = 300) -> str:
    """bf16 GGUF of `hf_dir` at `out` by `src`/convert_hf_to_gguf.py (gguf-py from `src` too)."""
    stage = tempfile.mkdtemp(prefix="conv-")
    for f in Path(hf_dir).iterdir():
        os.symlink(f.resolve(), os.path.join(stage, f.name))
    os.symlink(os.path.abspath(tokenizer), os.path.join(stage, "tokenizer.model"))
    env = dict(os.environ, PYTHONPATH=os.path.join(src, "gguf-py"))
    p = subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), stage,
                        "--outtype", "bf16", "--outfile", out], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if p.returncode or not os.path.exists(out):
        raise RuntimeError(f"convert_hf_to_gguf.py failed ({p.returncode}): {p.stderr[-1500:]}")
    return out


def bench_rows(text: str) -> list[dict]:
    """The records of `llama-bench -o json` output (a JSON list; log lines around it ignored)."""
    start = text.find("[")
    while start >= 0:
        try:
            rows = json.JSONDecoder().raw_decode(text[start:])[0]
            if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
                return rows
        except ValueError:
            pass
        start = text.find("[", start + 1)
    raise ValueError(f"no llama-bench JSON in output: {text[-500:]!r}")


def summarize(rows: list[dict]) -> dict:
    """pp<N> (prompt tok/s at depth 0) and tg_<depth>_ms (ms per generated token)."""
    out = {}
    for r in rows:
        depth = int(r.get("n_depth", 0) or 0)
        if int(r.get("n_prompt", 0)) > 0 and int(r.get("n_gen", 0)) == 0 and depth == 0:
            out[f"pp{int(r['n_prompt'])}"] = float(r["avg_ts"])
        elif int(r.get("n_gen", 0)) > 0 and int(r.get("n_prompt", 0)) == 0:
            out[f"tg_{depth}_ms"] = 1e3 / float(r["avg_ts"])
    return out


def batched_tg(text: str, sequences: int = 16) -> float:
    """Generation tok/s (S_TG t/s) of the `sequences` row of llama-batched-bench's table."""
    header = None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "S_TG t/s" in cells and "B" in cells:
            header = cells
            continue
        if header and len(cells) == len(header) and re.fullmatch(r"\d+", cells[header.index("B")]):
            if int(cells[header.index("B")]) == sequences:
                return float(cells[header.index("S_TG t/s")])
    raise ValueError(f"no B = {sequences} row in llama-batched-bench output: {text[-500:]!r}")


def _run(cmd: list[str], timeout: int) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode:
        raise RuntimeError(f"{os.path.basename(cmd[0])} failed ({p.returncode}): {p.stderr[-1500:]}")
    return p.stdout


def bench(gguf: str, bin_dir: str, long: int = 32768, batched: bool = False, reps: int = 3) -> dict:
    """llama.cpp's figures for cuda_bench's table (flash attention on, all layers on the GPU)."""
    lb = os.path.join(bin_dir, "llama-bench")
    base = [lb, "-m", gguf, "-ngl", "99", "-fa", "1", "-r", str(reps), "-o", "json"]
    out = summarize(bench_rows(_run(base + ["-p", "512", "-n", "0"], 300)))
    out.update(summarize(bench_rows(_run(base + ["-p", "16384", "-n", "0", "-ub", "2048"], 300))))
    depths = "2048" + (f",{long}" if long else "")
    out.update(summarize(bench_rows(_run(base + ["-p", "0", "-n", "128", "-d", depths], 300))))
    if batched:
        text = _run([os.path.join(bin_dir, "llama-batched-bench"), "-m", gguf, "-ngl", "99", "-fa",
                     "on", "-c", "40960", "-kvu", "-npp", "2048", "-ntg", "128", "-npl", "1,16"], 300)
        out["b16_tg"] = batched_tg(text)
    return out
