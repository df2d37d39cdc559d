"""The plane table row the CUDA attention kernels read (triton_decode.plane_row), on the CPU:
its fields, and the refusal of storage the kernels would misread.  At head dims divisible by 8
the kernels are compiled as if every row were 16-byte aligned (triton_attn.plane_at: vector
loads); a plane whose storage is not must be refused here, not read wrong there."""
import pytest
import torch

from muser.backends.cuda.triton_decode import plane_row
from muser.cache import GrowingPlane, RingPlane


def _ring(d=16):
    return RingPlane(0, 8, 64, 2, d, torch.bfloat16, "cpu")


def test_a_ring_row_is_its_pointers_and_token_major_strides():
    p = _ring()
    assert plane_row(p) == [p.keys.data_ptr(), p.values.data_ptr(), 2 * 16, 16]


def test_a_growing_row_is_head_major():
    p = GrowingPlane(0, 64, 2, 16, torch.bfloat16, "cpu")
    p.reserve(10)
    row = plane_row(p)
    assert row[2] == 16 and row[3] == p.keys.stride(0)


@pytest.mark.parametrize("field", ["keys", "values"])
def test_misaligned_storage_is_refused(field):
    p = _ring()
    base = getattr(p, field)
    shifted = torch.empty(base.numel() + 1, dtype=base.dtype)[1:].view(base.shape)  # 2 bytes off
    setattr(p, field, shifted)
    if field == "values":
        p.keys = torch.empty(base.numel() + 8, dtype=base.dtype)[8:].view(base.shape)  # 16 off
    with pytest.raises(ValueError, match="16-byte aligned"):
        plane_row(p)


def test_a_head_dim_not_divisible_by_8_is_read_unaligned_and_accepted():
    p = _ring(d=12)
    p.keys = torch.empty(p.keys.numel() + 1, dtype=p.keys.dtype)[1:].view(p.keys.shape)
    p.values = torch.empty(p.values.numel() + 1, dtype=p.values.dtype)[1:].view(p.values.shape)
    assert plane_row(p)[2:] == [24, 12]
