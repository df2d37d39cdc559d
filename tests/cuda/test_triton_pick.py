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
