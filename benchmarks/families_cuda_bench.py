"""The 2025-26 hybrid families at real shapes on one GPU: muser vs transformers vs the floor.

gpt-oss-20b (openai/gpt-oss-20b's config as published: 24 layers alternating a 128-token window
with full attention, sinks, YaRN, 32 experts top-4) and a Gemma 4 of similar size (the 26B-A4B
shape as its GGUF header states it: 30 layers, 128 experts top-8 beside a dense MLP, 512-dim
global heads).  Random bf16 weights, built once by transformers on the GPU; muser runs over the
same tensors (`muser.engine.loader.from_state_dict`: no checkpoint written, dense tensors shared).

Measured in the same process, one model at a time:
  * floor: bytes a decode token must read (attention, norms, router, the k routed experts of
    every layer, the head) / device-to-device copy bandwidth (read + write, measured here);
    batch 16: the experts 16 tokens are expected to touch, E (1 - (1 - k/E)^16) per layer;
  * batch-1 decode ms/token at --context (API: session.decode + argmax read back);
  * 16 sessions decoding together at --context, tokens/s;
  * prefill of --prefill tokens, tokens/s (engine's default CUDA chunk);
  * transformers (same weights, its default attention, bf16): decode b1 / b16, prefill;
  * a logits cross-check muser vs transformers (prefill + 6 decode steps).

    PYTHONPATH=. python3 benchmarks/families_cuda_bench.py [--models gpt-oss-20b,gemma4-26b-a4b]
        [--context 2048] [--prefill 16384] [--steps 24] [--out DIR] [--no-hf] [--profile]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

import torch

from cuda_measure import (copy_bandwidth, cross_check, hf_decode, hf_prefill, muser_batch, muser_decode,
                          muser_prefill, prefill_profile)
from muser.testing import GPT_OSS_20B

# google/gemma-4-26B-A4B's text model as its GGUF header states it (gemma4.* keys: 8 kv heads of
# 256 on sliding layers, 2 of 512 on global ones -- which transformers' config gives only with V = K,
# as its EP plan for this model says -- and 128 experts top-8 of width 704 beside a 2112 MLP).
GEMMA4_26B = dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112, num_hidden_layers=30,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=256, sliding_window=1024,
                  global_head_dim=512, num_global_key_value_heads=2, attention_k_eq_v=True,
                  final_logit_softcapping=30.0, hidden_size_per_layer_input=0, enable_moe_block=True,
                  num_experts=128, top_k_experts=8, moe_intermediate_size=704, max_position_embeddings=131072)
LOG = []


def log(*a):
    line = " ".join(str(x) for x in a)
    LOG.append(line)
    print(line, flush=True)


def build(name: str, max_context: int, layers: int | None = None, dtype=torch.bfloat16):
    """(transformers model on the GPU with random weights, its config as a dict); `layers`: the
    same width with fewer layers (families_check.py: a float32 oracle that fits beside it)."""
    import transformers as tr
    if name == "gpt-oss-20b":
        d = {k: v for k, v in GPT_OSS_20B.items() if k not in ("architectures", "model_type", "quantization_config")}
        if layers:
            d.update(num_hidden_layers=layers, layer_types=["sliding_attention", "full_attention"] * (layers // 2))
        cfg = tr.GptOssConfig(**d)
    else:
        d = dict(GEMMA4_26B)
        if layers:
            d.update(num_hidden_layers=layers, layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
        cfg = tr.Gemma4TextConfig(**d)
        cfg._attn_implementation = "sdpa"
    cfg.max_position_embeddings = max(cfg.max_position_embeddings, max_context)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = tr.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():                 # norms and sinks away from their init constants
        for pname, p in model.named_parameters():
            if "norm" in pname or "sinks" in pname:
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    d = cfg.to_dict()
    d["model_type"] = cfg.model_type
    return model, d


def active_bytes(engine, batch: int = 1) -> tuple[int, int]:
    """(bytes a decode step reads at this batch, total weight bytes): everything but the
    embedding table, with each layer's experts counted as the expected number touched."""
    w, spec = engine.weights, engine.spec
    total = w.nbytes()
    embed = w.embed.numel() * w.embed.element_size()
    per_token = total - embed + (embed if w.lm_head is None else 0)   # a tied head reads the table
    if spec.moe is not None:
        E, k = spec.moe.num_experts, spec.moe.top_k
        touched = E * (1 - (1 - k / E) ** batch)
        for lw in w.layers:
            mw = lw.moe
            if mw is None:
                continue
            one = sum(t.numel() * t.element_size() for t in
                      (mw.w_gate_up or []) + (mw.w_gate or []) + (mw.w_up or []) + list(mw.w_down)) / E
            per_token -= int(one * (E - touched))
    return per_token, total


def decode_b1(r, engine, args, vocab) -> float:
    """API ms/token at batch 1 (cuda_measure.muser_decode); the bare graph replay and, with
    --profile, the step's kernel profile (taken while its session is alive) go into r."""
    api, bare, prof = muser_decode(engine, args.context, args.steps, vocab, prof=args.profile)
    r["muser_decode_bare_ms"] = bare * 1e3
    if prof is not None:
        r["profile_step_b1"] = prof
    return api * 1e3


def step(r, key, fn, *a):
    t0 = time.perf_counter()
    try:
        r[key] = fn(*a)
    except Exception as e:                   # noqa: BLE001 -- recorded, the run goes on
        r[key] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        traceback.print_exc()
    log(f"  {key}: {r[key]}  ({time.perf_counter() - t0:.1f} s)")
    torch.cuda.empty_cache()


def run_model(name, args, bw, results):
    from muser.engine.loader import from_state_dict
    t0 = time.perf_counter()
    ctx = max(args.context + args.steps + 64, args.prefill) + 1024
    model, cfg = build(name, ctx)
    engine = from_state_dict(cfg, model.state_dict(), device="cuda", dtype="bfloat16", max_context=ctx,
                             name=name)
    vocab = engine.spec.vocab_size
    r = results[name] = {"setup_s": round(time.perf_counter() - t0, 1)}
    (a1, total), (a16, _) = active_bytes(engine, 1), active_bytes(engine, 16)
    r.update(weight_bytes=total, read_b1=a1, read_b16=a16, floor_b1_ms=a1 / bw * 1e3,
             floor_b16_ms=a16 / bw * 1e3, fused_step=engine.decode_runner() is not None)
    log(f"{name}: weights {total / 1e9:.1f} GB, decode reads {a1 / 1e9:.2f} GB (b1) / {a16 / 1e9:.2f} GB (b16), "
        f"floor {r['floor_b1_ms']:.3f} ms, setup {r['setup_s']} s, fused step {r['fused_step']}")
    step(r, "muser_decode_b1_ms", lambda: decode_b1(r, engine, args, vocab))
    step(r, "muser_b16_tps", lambda: muser_batch(engine, 16, args.context, max(8, args.steps // 2), vocab)[0])
    step(r, "muser_prefill_tps", lambda: muser_prefill(engine, args.prefill, vocab, None))
    if args.profile:                         # where a prefill's GPU time goes
        step(r, "profile_prefill", lambda: prefill_profile(engine, args.prefill, vocab))
    if not args.no_hf:
        step(r, "cross_check", lambda: cross_check(engine, model, vocab))
        step(r, "hf_decode_b1_ms", lambda: hf_decode(model, 1, args.context, max(4, args.steps // 3), vocab) * 1e3)
        step(r, "hf_b16_tps", lambda: 16 / hf_decode(model, 16, args.context, 4, vocab))
        for n in (args.prefill, 4096):
            key = f"hf_prefill_{n}_tps"
            step(r, key, lambda n=n: hf_prefill(model, n, vocab, reps=1))
            if not str(r[key]).startswith("failed"):
                break
    engine = model = None                    # free both before the next model
    gc.collect()
    torch.cuda.empty_cache()


def table(results) -> str:
    def f(x, fmt="{:.2f}"):
        return fmt.format(x) if isinstance(x, (int, float)) else "-"
    rows = ["| model | weights GB | read/token GB | floor ms | muser b1 ms | hf b1 ms | muser b16 tok/s | "
            "hf b16 tok/s | muser prefill tok/s | hf prefill tok/s | max rel err vs hf |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        hfp = next((v for k, v in r.items() if k.startswith("hf_prefill") and not str(v).startswith("failed")), None)
        cc = r.get("cross_check")
        rows.append(f"| {name} | {f(r['weight_bytes'] / 1e9, '{:.1f}')} | {f(r['read_b1'] / 1e9)} | "
                    f"{f(r['floor_b1_ms'], '{:.3f}')} | {f(r.get('muser_decode_b1_ms'))} | {f(r.get('hf_decode_b1_ms'))} | "
                    f"{f(r.get('muser_b16_tps'), '{:,.0f}')} | {f(r.get('hf_b16_tps'), '{:,.0f}')} | "
                    f"{f(r.get('muser_prefill_tps'), '{:,.0f}')} | {f(hfp, '{:,.0f}')} | "
                    f"{f(cc[0], '{:.2e}') if isinstance(cc, (list, tuple)) else '-'} |")
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt-oss-20b,gemma4-26b-a4b")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--prefill", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--profile", action="store_true", help="kernel-time profiles of a decode step and a prefill")
    args = ap.parse_args(argv)
    bw = copy_bandwidth()
    log(f"{torch.cuda.get_device_name()}: copy {bw / 1e12:.2f} TB/s (read + write)")
    results = {}
    for name in args.models.split(","):
        run_model(name, args, bw, results)
        with open(os.path.join(args.out, "families_cuda.json"), "w") as fh:
            json.dump({"bandwidth": bw, "args": vars(args), "results": results}, fh, indent=1, default=str)
    log(table(results))
    with open(os.path.join(args.out, "families_cuda.log"), "w") as fh:
        fh.write("\n".join(LOG) + "\n")


if __name__ == "__main__":
    sys.exit(main())
