"""Flags several `muser` commands share, and the engine they describe.

Owns: `model_args` (which model, where, in what dtype / weight path / cache family, context,
prefill chunk), `sampling_args`, `load_engine(args)` and `read_key(key_file)` (the one pack-key
rule, muser.pack.load_key).  Does not own: any command (cli/main.py, serve.py, pack.py, plan.py).
"""
from __future__ import annotations

import argparse

from ..engine.loader import DEFAULT_MODEL


def model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"embedded name, .gguf file or HF dir (default {DEFAULT_MODEL})")
    p.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: fastest accurate for the device)")
    p.add_argument("--backend", default="ring", choices=["ring", "oracle"])
    p.add_argument("--quant", default=None,
                   help="weight path: none | int8 (CPU and CUDA) | int8-head (CUDA: the head "
                        "alone, as Q8_0 blocks: less memory, bf16's logits) | int8-head-fast "
                        "(CUDA: the head alone, as int8 rows: less memory and time, its own "
                        "logits) (default: fastest accurate -- CPU int8; CUDA none, or "
                        "int8-head where the head is stored as Q8_0: bf16's logits bit for bit)")
    p.add_argument("--max-context", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None,
                   help="prefill chunk in tokens (default: 512 on CPU, 8k-16k on CUDA by GPU memory); "
                        "a server with many users may want smaller chunks, so decode steps are not held up")


def sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def load_engine(args):
    from ..engine.loader import load
    return load(args.model, device=args.device, dtype=args.dtype, backend=args.backend,
                max_context=args.max_context, quant=args.quant, chunk_size=args.chunk_size)


def read_key(key_file: str | None) -> bytes | None:
    """The pack key, read exactly as every command reads it (--key-file, else MUSER_PACK_KEY)."""
    from ..pack.manifest import load_key
    return load_key(key_file)
