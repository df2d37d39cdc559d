"""Block int8 weights for quant="int8-head" (backends/cuda/weights_int8.quantize_blocks,
BlockInt8), host side: GGUF's Q8_0 layout -- int8 with a float16 scale a 32-key block.  Values
that came from Q8_0 come back exactly (the embedded 270M's head among them, so its int8-head
logits are the bf16 engine's); others are within half a step of their block; what cannot be
held is refused.  `exact_blocks` (the CUDA default's test for a Q8_0 head,
defaults.default_head) answers only for a head the blocks give back bit for bit.  The kernel:
tests/cuda/test_triton_ops.py -k block_int8; the embedded GGUF's head: tests/model/test_gguf.py
-k q8_0_blocks."""
import pytest
import torch

from muser.backends.cuda.weights_int8 import BlockInt8, RowInt8, exact_blocks, quantize_blocks


def _q8_0(rows: int, cols: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random Q8_0 blocks as llama.cpp writes them: each block's largest |q| is 127."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols // 32, 32), generator=g)
    q[..., 0] = torch.where(torch.rand(rows, cols // 32, generator=g) < 0.5, -127, 127)
    d = (torch.rand(rows, cols // 32, 1, generator=g) * 0.02 + 1e-4).to(torch.float16)
    return q.reshape(rows, cols).to(torch.int8), d.reshape(rows, cols // 32)


def test_q8_0_values_come_back_exactly():
    q, d = _q8_0(64, 256, 0)
    w = (q.float().reshape(64, -1, 32) * d.float()[..., None]).reshape(64, 256)
    b = quantize_blocks(w)
    assert isinstance(b, BlockInt8) and isinstance(b, RowInt8)
    assert torch.equal(b.q, q) and torch.equal(b.scale, d)
    assert torch.equal(b.dequantized(), w)
    assert torch.equal(b.dequantized(torch.bfloat16), w.to(torch.bfloat16))


def test_q8_0_values_cast_to_bf16_come_back_as_those_bf16_values():
    """The engine casts before its backend quantizes: a Q8_0 head arrives as bf16(q * d).  The
    scale search finds a float16 scale whose bf16(q * s) -- the tile's weight -- is that bf16
    value, for every block (without it a block's largest, rounded, moves its scale)."""
    q, d = _q8_0(256, 256, 3)
    w = (q.float().reshape(256, -1, 32) * d.float()[..., None]).reshape(256, 256)
    wb = w.to(torch.bfloat16)
    b = quantize_blocks(wb)
    assert torch.equal(b.dequantized(torch.bfloat16), wb)
    plain = quantize_blocks(wb.float())          # the same values as float32: no search
    assert not torch.equal(plain.dequantized(torch.bfloat16), wb)   # the search made it exact


def test_other_values_are_within_half_a_step_of_their_block():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(32, 128, generator=g) * torch.rand(32, 4, 1, generator=g).repeat_interleave(
        32, 1).reshape(32, 128)
    w[5, 32:64] = 0.0                                     # an all-zero block: scale 0, q 0
    b = quantize_blocks(w)
    assert b.scale.dtype == torch.float16 and b.scale.shape == (32, 4)
    assert float(b.scale[5, 1]) == 0.0 and torch.all(b.q[5, 32:64] == 0)
    step = b.scale.float().repeat_interleave(32, 1)
    assert torch.all((b.dequantized() - w).abs() <= step / 2 * 1.001 + 1e-12)
    assert b.nbytes() == 32 * 128 + 2 * 32 * 4


def test_what_blocks_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_blocks(torch.ones(4, 48))
    with pytest.raises(ValueError, match="overflows float16"):
        quantize_blocks(torch.full((2, 32), 1e8))


def _q8_0_head(rows: int, cols: int, dtype=torch.bfloat16, seed: int = 5) -> torch.Tensor:
    q, d = _q8_0(rows, cols, seed)
    return (q.float().reshape(rows, -1, 32) * d.float()[..., None]).reshape(rows, cols).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_exact_blocks_find_a_q8_0_head_cast_to_16_bits(dtype):
    w = _q8_0_head(1000, 64, dtype)                     # past SAMPLE_ROWS: sample, then all rows
    b = exact_blocks(w)
    assert isinstance(b, BlockInt8) and torch.equal(b.dequantized(dtype), w)


def test_exact_blocks_refuse_any_head_they_do_not_give_back():
    g = torch.Generator().manual_seed(2)
    assert exact_blocks(torch.randn(512, 64, generator=g).to(torch.bfloat16)) is None
    w = _q8_0_head(1000, 64)
    # one weight off the grid, on a row the sample skips: only the whole-head check sees it
    from muser.backends.cuda.weights_int8 import SAMPLE_ROWS
    row = 1000 // SAMPLE_ROWS * 3 + 1
    w[row, 7] = w[row, 7] + torch.finfo(torch.bfloat16).eps * w[row, :32].abs().max() * 0.37
    assert not torch.equal(w, _q8_0_head(1000, 64)) and exact_blocks(w) is None
    z = _q8_0_head(64, 64)
    assert exact_blocks(z) is not None
    zero = (z == 0).nonzero()[0]            # a q of 0 (~16 of 4,096 weights)
    z[zero[0], zero[1]] = -0.0              # the same value as the blocks' +0.0, not the bits
    assert torch.equal(z, _q8_0_head(64, 64)) and exact_blocks(z) is None
    assert exact_blocks(_q8_0_head(64, 64).float()) is None        # float32: no 16-bit cast
    assert exact_blocks(torch.zeros(8, 48, dtype=torch.bfloat16)) is None   # not whole blocks
    assert exact_blocks(torch.full((8, 32), 1e8).to(torch.bfloat16)) is None  # scale past f16
