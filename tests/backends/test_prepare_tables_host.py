"""The prepare launch's tables (backends/cuda/triton_decode.prepare_tables) on the CPU: one
plane row repeated per chunk row, built where the buffers live (on CUDA: repeated on the device,
not copied and pinned row by row on the host), and the meta row r = (slot r, nothing visible)."""
import pytest
import torch

from muser.backends.cuda.triton_decode import prepare_tables


@pytest.mark.parametrize("rows,kv,d", [(1, 1, 256), (7, 4, 16), (16384, 1, 256)])
def test_every_row_of_a_prepare_table_is_the_buffers_plane(rows, kv, d):
    k = torch.empty(rows, kv, d, dtype=torch.bfloat16)
    v = torch.empty_like(k)
    table, meta = prepare_tables(k, v)
    assert table.shape == (rows, 4) and table.is_contiguous() and table.dtype == torch.int64
    want = torch.tensor([k.data_ptr(), v.data_ptr(), kv * d, d], dtype=torch.int64)
    assert torch.equal(table, want.expand(rows, 4))
    assert torch.equal(meta, torch.stack([torch.arange(rows), torch.zeros(rows, dtype=torch.long)], 1))
