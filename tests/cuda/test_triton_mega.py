"""`triton_mega.mlp_block` (a decode layer's MLP half, and optionally its output projection, as
one persistent launch) against the launches the decode step runs for them -- dot_rows (o),
add_norm, dot_rows (gate|up, act * up), dot_rows (down;
where it has split-K pieces, left for the add_norm to sum: MUSER_FUSE_SUM), add_norm -- bitwise,
at the 270M's shapes, a small one and one with pieces, 1 to 16 rows, twice (the counters reset
themselves).  Under the interpreter the persistent grid is one program (its programs run
one after another, so a wait on another program would never end); on a GPU, one per SM."""
import pytest
import torch

from cudautil import HAS_CUDA, needs_kernels

pytestmark = needs_kernels


def four_launches(h, o, wpa, wpf, gu, dw, wpd, wnx, eps, att=None, wo=None, wq=None):
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_ops import add_norm
    if att is not None:                                # the o projection first (five launches)
        o = dot_rows(att, wo, rows=16)
    h1, x1 = add_norm(h, wpf, eps, False, d1=o, w_post=wpa)
    a = dot_rows(x1, gu, glu=True, gelu=True, rows=16)
    d = dot_rows(a, dw, rows=16, defer=True)          # split-K pieces: summed by the add_norm
    h2, x2 = add_norm(h1, wnx, eps, False, d1=d, w_post=wpd)
    return h2, x2, (dot_rows(x2, wq, rows=16) if wq is not None else None)


@pytest.mark.parametrize("with_o", [False, True, "and qkv"])
@pytest.mark.parametrize("n,f,hd", [(640, 2048, 1024), (128, 256, 64), (128, 4096, 64)])
@pytest.mark.parametrize("rows", [1, 5, 16])
def test_one_persistent_launch_gives_the_four_launches_bits(dev, kdtype, n, f, hd, rows, with_o):
    """(The last shape: a down projection with 4 split-K pieces.  with_o: the attention's output
    projection folded in as well -- five launches against one.)"""
    from muser.backends.cuda.triton_mega import mlp_block
    g = torch.Generator().manual_seed(n + rows)
    h, o = (torch.randn(rows, n, generator=g).to(dev, kdtype) for _ in range(2))
    gu = (torch.randn(2 * f, n, generator=g) / n ** 0.5).to(dev, kdtype)
    dw = (torch.randn(n, f, generator=g) / f ** 0.5).to(dev, kdtype)
    wpa, wpf, wpd, wnx = ((torch.rand(n, generator=g) + 0.5).to(dev) for _ in range(4))
    att = torch.randn(rows, hd, generator=g).to(dev, kdtype) if with_o else None
    wo = (torch.randn(n, hd, generator=g) / hd ** 0.5).to(dev, kdtype) if with_o else None
    wq = (torch.randn(3 * n // 2, n, generator=g) / n ** 0.5).to(dev, kdtype) \
        if with_o == "and qkv" else None
    want = four_launches(h, o, wpa, wpf, gu, dw, wpd, wnx, 1e-6, att, wo, wq)
    cnt = torch.zeros(6, dtype=torch.int32, device=dev)
    for _ in range(2):
        got = mlp_block(h, None if with_o else o, wpa, wpf, gu, dw, wpd, wnx, 1e-6,
                        out={"cnt": cnt}, programs=None if HAS_CUDA else 1, att=att, wo=wo,
                        wqkv=wq)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert (got[2] is None and wq is None) or torch.equal(got[2], want[2])
        assert int(cnt.abs().sum()) == 0


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (graphs)")
@pytest.mark.parametrize("arch", ["gemma3", "cohere2"])
def test_the_step_with_one_launch_mlp_halves_gives_the_default_bits(arch):
    """MUSER_MEGA=mlp in the decode step (graph replays, a prefill, a 12-row verification block
    and a 40-row chunk through the same layer loop): the logits of the default launches,
    bitwise.  Cohere2 (a parallel block) keeps its own launches: the switch must not touch it."""
    from cudautil import prefill_then_decode as run

    from muser.env import Env
    from muser.testing import tiny_model
    eng = tiny_model(arch, device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    block = [(7 * i) % 200 + 3 for i in range(12)]
    eng.backend.reset_runner(Env(mega="off"))
    plain = (run(eng, extend=block), run(eng, extend=block * 3))
    eng.backend.reset_runner(Env(mega="mlp"))
    assert (eng.backend.runner(eng).step.mega_cnt is not None)
    got = (run(eng, extend=block), run(eng, extend=block * 3))
    assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])
