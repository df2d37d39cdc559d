"""Default run settings per device: the fastest choice that keeps the accuracy contract.

Owns: `default_dtype`, `default_quant`, `default_head` and `default_chunk_size` (what `muser.load`
fills in when not told; `default_head` once the weights are read: CUDA keeps a Q8_0 head as its
blocks), and `check(config)`, which refuses a device / family / dtype / weight-path combination
no backend runs -- before any weight is read.  Measured in benchmarks/RESULTS.md; change the
defaults only with a measurement.
"""
from __future__ import annotations

from ..config import HEAD_ONLY, EngineConfig
from ..errors import ModelFormatError, RequestError


def default_dtype(device: str, backend: str = "ring") -> str:
    if backend == "oracle":
        return "float32"
    return "bfloat16"


def default_quant(device: str, dtype: str, backend: str = "ring") -> str:
    """CPU ring: int8 weights (bf16 activations) -- ~1.7x the decode rate of bf16 weights, logits
    within 0.05 of f32's range, greedy agreement up to documented near-ties (test_fast_path)."""
    if backend == "ring" and str(device) == "cpu" and dtype == "bfloat16":
        return "int8"
    return "none"


def default_head(config: EngineConfig, spec, weights, env) -> EngineConfig:
    """The quant a CUDA engine runs when none was asked for, once its weights are on the device:
    a head whose weights are Q8_0 blocks exactly (stored as Q8_0 and cast at load: the embedded
    270M's) is kept as those blocks -- quant="int8-head", whose logits are the bf16 head's bit
    for bit (the tile dequantizes each weight to the same bf16; every K/V row is bf16's, so cuts
    move between the two) and whose head reads ~half the bytes (H100: a 270M-shape step -29 us,
    1B -61, 4B -134; H200: even -- benchmarks/RESULTS.md, forty-fourth session).  Any other
    head, an explicit quant, or a model the int8 path does not take: `config` as it is.  Sets
    weights.lm_head to the blocks it found (the backend keeps them, no second search) and a tied
    head's lookup table to them too (weights_int8.keep_exact_blocks: the float table dropped)."""
    if (config.quant != "none" or config.backend != "ring" or config.device.split(":")[0] != "cuda"
            or config.dtype not in ("bfloat16", "float16")):
        return config
    from dataclasses import replace
    from .cuda.weights_int8 import keep_exact_blocks, why_not_int8
    if why_not_int8(spec, weights, env) or not keep_exact_blocks(weights):
        return config
    return replace(config, quant="int8-head")


def default_chunk_size(device: str) -> int:
    """Prefill chunk in tokens.  CPU: 512.  CUDA: 16,384 on GPUs with >= 64 GiB (H100-96 / H200
    class), else 8,192 -- the token budgets vLLM and SGLang use on such GPUs; on an H200 a 16k
    chunk prefills 16k tokens 1.1-1.35x faster than 4k chunks (benchmarks/RESULTS.md, CUDA)."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda":
        return 512
    total = torch.cuda.get_device_properties(dev).total_memory
    return 16384 if total >= 64 << 30 else 8192


def check(config: EngineConfig) -> None:
    """Refuse what no backend runs: the oracle off float32-on-CPU, int8 weights off the ring
    (CPU: the fast path; CUDA: the fused step's bf16 / f16 activations -- whether the model
    takes it is the backend's `check_model`)."""
    if config.backend == "oracle" and (config.dtype != "float32" or config.device != "cpu"):
        raise RequestError("the oracle backend is float32 on the CPU by definition, got "
                           f"{config.dtype} on {config.device}")
    if config.quant == "none":
        return
    kind = config.device.split(":")[0]
    if config.backend != "ring" or kind not in ("cpu", "cuda"):
        raise ModelFormatError(f"quant={config.quant!r} runs on the ring backend on the CPU or "
                               f"CUDA; got device {config.device!r}, backend {config.backend!r}")
    if config.quant in HEAD_ONLY and kind != "cuda":
        raise ModelFormatError(f"quant={config.quant!r} (the head alone as int8) is a CUDA weight "
                               f"mode; on {config.device!r} take quant='int8' (every projection "
                               f"and the head) or 'none'")
    if kind == "cuda" and config.dtype not in ("bfloat16", "float16"):
        raise ModelFormatError(f"quant={config.quant!r} on CUDA takes bfloat16 or float16 "
                               f"activations, got {config.dtype}")
