"""MUSER_NORM_OUT: a projection's add+norm run by the projection's own last program
(triton_dot_tail.py) gives add_norm's bits -- h' and x, with and without split-K pieces, the
post-projection norm and the next norm, at 1 and several rows -- and leaves its counter at 0 for
the next launch; and an engine with it gives the default step's logits, bitwise (decode steps,
a batch, chunks, a greedy run).  Kernel rows run under Triton's interpreter too."""
import pytest
import torch

from cudautil import needs_gpu, needs_kernels

from muser.backends.cuda.triton_dot import dot_rows
from muser.backends.cuda.triton_dot_tail import NormOut, tail_fuses
from muser.backends.cuda.triton_ops import add_norm

# (n outputs = the hidden width, k, decode tile (block_n, block_k, warps, stages, piece))
SHAPES = [(64, 96, (16, 32, 4, 2, 0)), (64, 128, (16, 32, 4, 2, 32)), (40, 64, (16, 32, 4, 2, 0))]


@needs_kernels
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("post,nxt", [(True, True), (False, True), (True, False)])
def test_the_projections_last_program_norms_as_add_norm_does(dev, kdtype, n, k, cfg, rows, post,
                                                               nxt):
    g = torch.Generator().manual_seed(n + k + rows)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dev, kdtype)
    x = torch.randn(rows, k, generator=g).to(dev, kdtype)
    h = torch.randn(rows, n, generator=g).to(dev, kdtype)
    w_post = (torch.rand(n, generator=g) + 0.5).to(dev, kdtype) if post else None
    w_next = (torch.rand(n, generator=g) + 0.5).to(dev, kdtype) if nxt else None
    d1 = dot_rows(x, w, config=cfg, rows=16, defer=True)      # Pieces where cfg splits K
    want_h, want_x = add_norm(h, w_next, 1e-6, False, d1=d1, w_post=w_post)
    cnt = torch.zeros(1, dtype=torch.int32, device=dev)
    tail = NormOut(h, w_post, w_next, 1e-6, False, cnt)
    for _ in range(2):                                         # the counter is back at 0
        got_h, got_x = dot_rows(x, w, config=cfg, rows=16, then=tail)
        assert int(cnt.item()) == 0
        assert torch.equal(got_h, want_h)
        assert (got_x is None) == (want_x is None)
        if want_x is not None:
            assert torch.equal(got_x, want_x)


def test_a_tail_needs_add_norms_warps_and_bf16_weights():
    assert tail_fuses(1152, 4, False) and tail_fuses(640, 4, False)
    assert not tail_fuses(2560, 4, False)          # add_norm takes 8 warps from 2,048 wide
    assert not tail_fuses(1152, 4, True)           # int8: no FMA contraction in the dot


@needs_kernels
def test_a_tail_refuses_what_it_cannot_norm(dev, kdtype):
    w = torch.zeros(64, 96, device=dev, dtype=kdtype)
    x = torch.zeros(1, 96, device=dev, dtype=kdtype)
    tail = NormOut(torch.zeros(1, 64, device=dev, dtype=kdtype), None, None, 1e-6, False,
                   torch.zeros(1, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="act\\*up"):
        dot_rows(x, torch.zeros(128, 96, device=dev, dtype=kdtype), glu=True, then=tail, rows=16)
    with pytest.raises(ValueError, match="warps"):
        dot_rows(x, w, config=(16, 32, 8, 2, 0), rows=16, then=tail)


PROMPTS = ([(5 * j + 3) % 300 + 3 for j in range(13)], [(7 * j + 1) % 300 + 3 for j in range(6)],
           [(11 * j + 2) % 300 + 3 for j in range(21)])


def _outputs(engine, norm_out: str):
    from muser.env import Env
    engine.backend.reset_runner(Env(norm_out=norm_out))
    out, sessions = [], []
    for p in PROMPTS:
        s = engine.new_session()
        out.append(s.prefill(p, chunk_size=5))
        for t in (9, 4, 33, 8):
            out.append(s.decode(t))
        sessions.append(s)
    for t in (12, 40, 7):
        out.append(engine.decode_batch(sessions, [t, t + 1, t + 2]))
    for chunk in (64, 1):
        out.append(engine.new_session().prefill(PROMPTS[2], chunk_size=chunk))
    firsts = []
    for p in PROMPTS[:2]:
        s = engine.new_session()
        s.prefill(p)
        firsts.append(s)
    run = engine.decode_greedy(firsts, [5, 6], 6, stop_ids=())
    return out, run.tokens


@needs_gpu
@pytest.mark.parametrize("family", ["gemma3", "cohere2", "olmo3"])
def test_an_engine_with_the_norm_in_the_projection_gives_the_default_bits(family):
    from muser.testing import tiny_model
    engine = tiny_model(family, device="cuda", dtype="bfloat16", window=4, tokenizer=False)
    want, want_tokens = _outputs(engine, "off")
    got, got_tokens = _outputs(engine, "16")
    step = engine.decode_runner().step
    if family == "gemma3":                 # the switch did something: both sites of a layer
        lw, fz = step.w.layers[0], step.fused[0]
        assert step._tails("o", lw.wo, 1) and step._tails("down", lw.w_down, 16)
        assert not step._tails("o", lw.wo, 17)
    assert got_tokens == want_tokens
    for a, b in zip(got, want):
        assert torch.equal(a, b)
