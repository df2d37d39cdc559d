"""One backend per Engine, chosen once (`muser.backends.select`); the model maths asks no device
questions; every CUDA module imports without Triton (and without a GPU)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from muser.backends import select
from muser.config import EngineConfig
from muser.env import Env
from muser.model import ops

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("config, name", [
    (EngineConfig(device="cpu", dtype="bfloat16", quant="int8"), "cpu"),
    (EngineConfig(device="cpu", dtype="float32"), "cpu"),
    (EngineConfig(device="cpu", dtype="float32", backend="oracle"), "reference"),
    (EngineConfig(device="cuda", dtype="bfloat16"), "cuda"),
    (EngineConfig(device="meta", dtype="float32"), "reference"),
])
def test_select_by_device_and_family(config, name):
    backend = select(config, Env())
    assert backend.name == name
    assert backend.invariant_rows == (64 if config.quant == "int8" else 0)


def test_the_reference_backend_is_the_eager_maths_and_the_reference_attention():
    from muser.attention.reference import attention
    from muser.backends.reference import attend
    import torch
    backend = select(EngineConfig(backend="oracle"), Env())
    assert backend.ops is ops.EAGER and backend.attention is attend
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, n, 8, generator=g) for n in (4, 2, 2))
    assert torch.equal(attend(q, k, v, None, 0.3), attention(q, k, v, torch.ones(3, 3, dtype=torch.bool), 0.3))


def test_an_engine_selects_once_and_the_env_it_was_built_with_decides():
    from muser.backends.cpu.ops import cpu_ops
    from muser.testing import tiny_model
    e = tiny_model()
    assert e.backend.name == "cpu" and e.backend.env is e.env
    off = select(e.config, Env(native=False))
    assert off.ops is cpu_ops(False) is ops.EAGER


def test_model_maths_ask_no_device_questions():
    for name in ("transformer.py", "ops.py"):
        src = (ROOT / "muser" / "model" / name).read_text()
        assert not re.search(r"is_cuda|device\.type|\.type\s*==|native|triton", src.split('"""', 2)[2]), name


def test_device_checks_live_in_the_backends():
    """Outside muser/backends only the kernels' own operand checks (model/native.py) ask."""
    pattern = re.compile(r"is_cuda|device\.type|torch\.cuda\.|[!=]= \"(cuda|cpu)\"")
    askers = sorted({f.relative_to(ROOT).as_posix() for f in (ROOT / "muser").rglob("*.py")
                     if pattern.search(f.read_text())} - {"muser/model/native.py"})
    assert all(a.startswith("muser/backends/") for a in askers), askers


CUDA_MODULES = ["muser.backends.cuda", "muser.backends.cuda.graph", "muser.backends.cuda.decode_step",
                "muser.backends.cuda.prefill", "muser.backends.cuda.ops", "muser.backends.cuda.triton_ops",
                "muser.backends.cuda.triton_rows", "muser.backends.cuda.triton_decode"]


def test_every_cuda_module_imports_without_triton():
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'triton' or name.startswith('triton.'):\n"
            "            raise ImportError('triton blocked for this test')\n"
            "sys.meta_path.insert(0, Block())\n"
            f"for m in {CUDA_MODULES!r}: __import__(m)\n"
            "from muser.backends.cuda import triton_rows\n"
            "assert not triton_rows.available()\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("growing, env, want", [
    # the defaults: rings merge their splits in groups of 4 and take the flat chunk loop; growing
    # planes groups of 16, the flat loop on aligned runs and the nested one elsewhere (the
    # faster of each on the H200, RESULTS.md)
    # (the merge loads 4 partials at once; full tiles skip the masks; p @ V accumulates in the dot)
    (False, Env(), {"split": 32, "group": 4, "block_n": 32, "chunk_loop": "flat", "dsplit": 1,
                    "depth": 4, "interior": True, "acc_dot": True}),
    (True, Env(), {"split": 128, "group": 16, "block_n": 32, "chunk_loop": "aligned", "dsplit": 1,
                   "depth": 4, "interior": True, "acc_dot": True}),
    (True, Env(merge_loads="1"), {"depth": 1}),
    (False, Env(chunk_loop="nested", ring_group=1 << 16), {"group": 1 << 16, "chunk_loop": "nested"}),
    (True, Env(chunk_columns="2", growing_rows=100), {"split": 128, "dsplit": 2}),   # whole tiles
    # growing splits of one tile take the flat loop too (auto: rings and one-tile splits flat)
    (True, Env(growing_rows=32), {"split": 32, "chunk_loop": "flat"}),
    (True, Env(growing_rows=64), {"split": 64, "chunk_loop": "aligned"}),
    (False, Env(ring_rows=64), {"split": 64, "chunk_loop": "flat"}),
    (True, Env(growing_rows=32, chunk_loop="nested"), {"chunk_loop": "nested"}),
])
def test_the_cuda_attention_layout_follows_the_env(growing, env, want):
    """triton_attn.layout: the reduction shape a decode step and a chunk share (no Triton needed)."""
    from muser.backends.cuda.triton_attn import layout
    got = layout(growing, 256, env)
    assert {k: got[k] for k in want} == want


@pytest.mark.parametrize("env, same", [
    (Env(attn_tiles="masked"), True),          # a speed choice: the same bits
    (Env(chunk_loop="nested"), True),
    (Env(merge_loads="1"), True),
    (Env(dot_tma="on"), True), (Env(dot_tma="off"), True),     # how a tile reaches smem
    (Env(attn_acc="add"), False),              # the arithmetic
    (Env(ring_rows=64), False),
    (Env(growing_group=8), False),
    (Env(gemv="fast"), False),
    (Env(pipeline="on"), True),                # the same steps, launched earlier
    (Env(dot_cpp="off"), True),
    (Env(dot_cpp="on"), False),                # same bits claimed, not yet checked on a GPU
    (Env(dot_cpp="norm"), False),              # add_norm's tree replayed in C++: not yet checked
])
def test_the_cuda_cut_encoding_names_the_arithmetic(env, same):
    """A CUDA engine's cuts carry "+cuda-<digest>": knobs that move a row's bits change it,
    speed knobs do not; so a cut from another arithmetic (an older muser, the CPU) is refused."""
    from muser.backends.cuda import arithmetic_tag
    base = arithmetic_tag(Env())
    assert base.startswith("+cuda-") and len(base) == len("+cuda-") + 6
    assert (arithmetic_tag(env) == base) == same


@pytest.mark.parametrize("quant, tag", [("none", ""), ("int8-head", ""), ("int8-head-fast", ""),
                                        ("int8", "+i2")])
def test_int8_rows_name_their_own_arithmetic_in_the_cut_encoding(quant, tag):
    """quant="int8" computes its own rows (and changed them in the thirty-seventh session: the
    decode tile behind the layout fence), so its cuts carry weights_int8.INT8_ROWS; the
    head-only modes' rows are bf16's (the head makes no row), their cuts bf16's encoding."""
    from muser.backends.cuda import CudaBackend, arithmetic_tag
    from muser.config import EngineConfig
    backend = CudaBackend(EngineConfig(device="cuda", dtype="bfloat16", quant=quant), Env())
    assert backend.encoding_tag == arithmetic_tag(Env()) + tag


@pytest.mark.parametrize("entry, same", [
    (((2560, 2048, False), (16, 128, 8, 2, 0)), True),     # a tile: speed only (the rule's piece)
    (((2560, 2048, False), (32, 512, 4, 3, 1024)), False),  # a piece the rule would not take
    (((1152, 6912, False), (32, 128, 4, 4, 1024)), True),   # the rule's piece, other speed fields
    (((1152, 6912, False), (64, 256, 4, 3, 2048)), False),
])
def test_only_a_tile_tables_pieces_move_the_cut_encoding(monkeypatch, entry, same):
    """The decode tile table (triton_dot_tiles.DOT_TILES) holds speed fields and the split-K
    piece; only a piece that departs from the rule is arithmetic, so a new or retuned tile
    leaves every cut readable and a new piece refuses them."""
    from muser.backends.cuda import arithmetic_tag
    from muser.backends.cuda import triton_dot_tiles
    base = arithmetic_tag(Env())
    monkeypatch.setitem(triton_dot_tiles.DOT_TILES, *entry)
    assert (arithmetic_tag(Env()) == base) == same
