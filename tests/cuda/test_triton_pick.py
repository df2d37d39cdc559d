"""`triton_pick.pick_rows` (the pipelined greedy graph's pick, one launch) against
`backends.greedy.greedy_rows` (torch): the same token and the same ok flag for every row --
ties inside a chunk and across chunks (the first wins), NaN, +inf, -inf, rows of nothing but
NaN or -inf, a maximum in the last, partial chunk -- and again on a second call (the tickets
reset themselves)."""
import math

import pytest
import torch

from muser.backends.greedy import greedy_rows

from cudautil import needs_kernels

pytestmark = needs_kernels
V = 2 * 8192 + 1500                                    # three chunks, the last one partial


def rows(dev):
    g = torch.Generator().manual_seed(3)
    r = torch.randn(9, V, generator=g)
    r[0, 40] = r[0, 900] = 9.0                         # a tie inside one chunk
    r[1, 8192 + 5] = r[1, 3] = 9.0                     # a tie across chunks
    r[2, 17] = math.nan                                # NaN is not a maximum
    r[2, 9000] = 9.0
    r[3, 12000] = math.inf                             # +inf wins, as the largest float
    r[3, 100] = torch.finfo(torch.float32).max         # ... and ties with it, first
    r[4] = -math.inf                                   # nothing to choose
    r[5] = math.nan                                    # nothing to choose
    r[6, V - 1] = 50.0                                 # the maximum in the partial chunk
    r[7, :] = 1.0                                      # every column ties: the first
    r[8, 2] = -math.inf
    return r.to(dev)


@pytest.mark.interp
@pytest.mark.parametrize("batch", [1, 5, 9])
def test_one_launch_picks_what_greedy_rows_picks(dev, batch):
    from muser.backends.cuda.triton_pick import PickWorkspace, pick_rows
    logits = rows(dev)[:batch].contiguous()
    want_tok, want_ok = greedy_rows(logits)
    ws = PickWorkspace(batch, V, dev)
    res = torch.zeros((2, batch), dtype=torch.int64, device=dev)
    for _ in range(2):
        pick_rows(logits, res, ws)
        assert res[0].tolist() == want_tok.tolist()
        assert res[1].tolist() == want_ok.long().tolist()
        assert int(ws.cnt.abs().sum()) == 0


N_HEAD = 17000               # 1,063 tiles of 16 columns (the last partial): two fold blocks


def crafted(dev, kdtype):
    """Rows of head values as bf16 can hold them: ties inside a tile and across tiles, NaN,
    +inf against the largest finite value, rows of -inf or NaN, a maximum in the last tile."""
    g = torch.Generator().manual_seed(4)
    r = torch.randn(8, N_HEAD, generator=g)
    r[0, 3] = r[0, 20] = 9.0                       # a tie inside one tile
    r[1, 250] = r[1, 40] = 9.0                     # a tie across tiles: column 40
    r[2, 16 * 1050] = r[2, 16 * 7 + 3] = 20.0      # ... and across fold blocks: the first
    r[2, 17] = math.nan
    r[3, 200] = math.inf
    r[3, 100] = torch.finfo(kdtype).max
    r[4] = -math.inf
    r[5] = math.nan
    r[6, N_HEAD - 1] = 50.0
    r[7, :] = 1.0
    return r.to(dev, kdtype)


def test_a_picking_head_picks_what_greedy_rows_picks_from_its_logits(dev, kdtype):
    """dot_rows(pick=True) + pick_partials == greedy_rows(dot_rows(widen=True)): one row at a
    time through a one-hot x whose column holds the crafted values (so the logits are exactly
    them), then random rows in batches of 1, 5, 16 and 70 (a chunk tile) -- int8 weights too."""
    from muser.backends.cuda.triton_dot import dot_rows
    from muser.backends.cuda.triton_pick import pick_partials
    cfg = {"config": (16, 16, 4, 1, 0)}
    res = torch.zeros((2, 1), dtype=torch.int64, device=dev)
    x = torch.zeros(1, 16, dtype=kdtype, device=dev)
    x[0, 0] = 1.0
    for row in crafted(dev, kdtype):
        w = torch.zeros(N_HEAD, 16, dtype=kdtype, device=dev)
        w[:, 0] = row
        want_tok, want_ok = greedy_rows(dot_rows(x, w, widen=True, **cfg))
        pick_partials(*dot_rows(x, w, pick=True, **cfg), res)
        assert res[:, 0].tolist() == [int(want_tok[0]), int(want_ok[0])]
    g = torch.Generator().manual_seed(5)
    cfg = {"config": (32, 32, 4, 1, 0)}
    w = torch.randn(300, 64, generator=g)
    s = w.abs().amax(1) / 127
    q = (w / s[:, None]).round().clamp(-127, 127).to(torch.int8).to(dev)
    for B in (1, 5, 16, 70):
        x = torch.randn(B, 64, generator=g).to(dev, kdtype)
        for wt, kw in ((w.to(dev, kdtype), cfg), (q, {**cfg, "scale": s.to(dev)})):
            res = torch.zeros((2, B), dtype=torch.int64, device=dev)
            want_tok, want_ok = greedy_rows(dot_rows(x, wt, widen=True, **kw))
            pick_partials(*dot_rows(x, wt, pick=True, **kw), res)
            assert res[0].tolist() == want_tok.tolist()
            assert res[1].tolist() == want_ok.long().tolist()


def test_a_picking_head_refuses_what_it_cannot_pick(dev, kdtype):
    from muser.backends.cuda.triton_dot import dot_rows
    x = torch.ones(2, 64, dtype=kdtype, device=dev)
    w = torch.ones(40, 64, dtype=kdtype, device=dev)
    with pytest.raises(ValueError, match="split-K pieces"):
        dot_rows(x, w, pick=True, config=(16, 32, 4, 1, 32))
