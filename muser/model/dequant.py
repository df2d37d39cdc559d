"""GGUF tensor bytes -> torch tensors.

Owns: dequantizing ggml block formats with torch ops (Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1, Q4_K, Q5_K, Q6_K, F32, F16, BF16), chunked over rows so a 262,144-row
embedding never needs a full float32 temporary when the target is bf16; every
other type goes through `gguf.quants.dequantize` (the maintained numpy code).
Does not own: reading the file (`gguf_file`) or naming tensors (`gguf_loader`).

Each torch routine is a line-for-line port of gguf-py's numpy
`dequantize_blocks`, with the same float32 operation order, so results are
bitwise equal to `gguf.quants.dequantize` (tests/model/test_gguf.py checks).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as np_dequantize

_SH4 = torch.tensor([0, 4], dtype=torch.uint8)
_SH2 = torch.tensor([0, 2, 4, 6], dtype=torch.uint8)
_SH1 = torch.arange(8, dtype=torch.uint8)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """[N, 1] float32 from the f16 at byte `at` of each block."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[N, 16*k] packed -> [N, 32*k]: low nibbles of each 16-byte group first, then high."""
    n = qs.shape[0]
    return ((qs.reshape(n, -1, 1, 16) >> _SH4.reshape(1, 1, 2, 1)) & 0x0F).reshape(n, -1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """[N, 4] bytes of a little-endian uint32 -> [N, 32] bits, bit j at column j."""
    return ((qh.reshape(-1, 4, 1) >> _SH1.reshape(1, 1, 8)) & 1).reshape(-1, 32)


def _q8_0(b):
    return b[:, 2:].view(torch.int8).float() * _f16(b, 0)


def _q4_0(b):
    d = _f16(b, 0)
    return d * (_nibbles(b[:, 2:]).view(torch.int8) - 8).float()


def _q4_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    return d * _nibbles(b[:, 4:]).float() + m


def _q5_0(b):
    d = _f16(b, 0)
    q = (_nibbles(b[:, 6:]) | (_bits32(b[:, 2:6]) << 4)).view(torch.int8) - 16
    return d * q.float()


def _q5_1(b):
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 8:]) | (_bits32(b[:, 4:8]) << 4)
    return d * q.float() + m


def _k_scale_min(s: torch.Tensor):
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins."""
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _q4_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, -1, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, -1, 1)
    qs = ((b[:, 16:].reshape(n, -1, 1, 32) >> _SH4.reshape(1, 1, 2, 1)) & 0x0F).reshape(n, -1, 32)
    return (d * qs.float() - dm).reshape(n, 256)


def _q5_k(b):
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, -1, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, -1, 1)
    ql = ((b[:, 48:].reshape(n, -1, 1, 32) >> _SH4.reshape(1, 1, 2, 1)) & 0x0F).reshape(n, -1, 32)
    qh = ((b[:, 16:48].reshape(n, -1, 1, 32) >> _SH1.reshape(1, 1, 8, 1)) & 1).reshape(n, -1, 32)
    return (d * (ql | (qh << 4)).float() - dm).reshape(n, 256)


def _q6_k(b):
    n = b.shape[0]
    scales = b[:, 192:208].view(torch.int8).float()
    d = (_f16(b, 208) * scales).reshape(n, 16, 1)
    ql = ((b[:, :128].reshape(n, -1, 1, 64) >> _SH4.reshape(1, 1, 2, 1)) & 0x0F).reshape(n, -1, 32)
    qh = ((b[:, 128:192].reshape(n, -1, 1, 32) >> _SH2.reshape(1, 1, 4, 1)) & 3).reshape(n, -1, 32)
    q = ((ql | (qh << 4)).view(torch.int8) - 32).reshape(n, 16, -1).float()
    return (d * q).reshape(n, 256)


_TORCH = {Q.Q8_0: _q8_0, Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q5_0: _q5_0, Q.Q5_1: _q5_1,
          Q.Q4_K: _q4_k, Q.Q5_K: _q5_k, Q.Q6_K: _q6_k}
_CHUNK_ELEMS = 1 << 23          # output elements per chunk (32 MiB of float32)


def as_torch(a: np.ndarray) -> torch.Tensor:
    """Zero-copy torch view of a (read-only) numpy memmap slice; muser never writes to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)     # "the given NumPy array is not writable"
        return torch.from_numpy(np.ascontiguousarray(a))


def dequantize(data: np.ndarray, ttype, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize a GGUF tensor's `.data` (as `gguf.GGUFReader` / `GGUFFile` shape it) to
    a torch tensor in torch order ([rows.., cols]) and `dtype`."""
    ttype = Q(int(ttype))
    block, tsize = GGML_QUANT_SIZES[ttype]
    if ttype in (Q.F32, Q.F16, Q.F64, Q.I8, Q.I16, Q.I32, Q.I64):
        return as_torch(data).to(dtype)
    lead = data.shape[:-1]
    cols = data.shape[-1] // tsize * block
    rows2d = data.reshape(-1, data.shape[-1])
    out = torch.empty((rows2d.shape[0], cols), dtype=dtype)
    step = max(1, _CHUNK_ELEMS // max(cols, 1))
    fn = _TORCH.get(ttype)
    for r0 in range(0, rows2d.shape[0], step):
        chunk = rows2d[r0:r0 + step]
        if ttype == Q.BF16:
            vals = as_torch(chunk).view(torch.bfloat16)
        elif fn is not None:
            vals = fn(as_torch(chunk).reshape(-1, tsize)).reshape(chunk.shape[0], cols)
        else:                                  # IQ*, Q2_K, Q3_K, TQ*, MXFP4, ...: gguf-py's numpy code
            vals = torch.from_numpy(np_dequantize(np.ascontiguousarray(chunk), ttype).reshape(chunk.shape[0], cols))
        out[r0:r0 + chunk.shape[0]] = vals
    return out.reshape(*lead, cols)


def q8_0_blocks(data: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw Q8_0 bytes [rows, cols/32*34] -> (qs int8 [rows, cols], scales float32 [rows, cols/32])."""
    rows = data.shape[0]
    b = as_torch(data).reshape(rows, -1, 34)                       # [rows, blocks, 34]
    scales = b[..., :2].contiguous().view(torch.float16).reshape(rows, -1).float()
    qs = b[..., 2:].contiguous().view(torch.int8).reshape(rows, -1)
    return qs, scales


# ---------------------------------------------------------------------------- MXFP4 (HF safetensors)
# FP4 E2M1 values by 4-bit code (sign in bit 3); OCP MX spec, as gpt-oss's checkpoints use it.
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def mxfp4_hf(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """gpt-oss's `*_blocks` / `*_scales` safetensors pair -> [..., rows, G * 32] in `dtype`.

    blocks uint8 [..., rows, G, 16]: 32 FP4 codes per block, two per byte, LOW nibble
    first (element 2j is byte j & 0xF, element 2j + 1 is byte j >> 4) -- unlike GGUF's
    MXFP4, which stores a block's first 16 values in the low nibbles.  scales uint8
    [..., rows, G]: E8M0 exponents, value = code * 2^(scale - 127).  Rows are output
    features, so the result is already [out, in] per expert (what `F.linear` takes).
    """
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales {tuple(scales.shape)}")
    lut = torch.tensor(FP4_E2M1, dtype=torch.float32)
    b = blocks.to(torch.uint8)
    vals = torch.stack((lut[(b & 0x0F).long()], lut[(b >> 4).long()]), dim=-1)      # [..., G, 16, 2]
    vals = torch.ldexp(vals.flatten(-2), (scales.to(torch.int32) - 127)[..., None])  # [..., G, 32]
    return vals.flatten(-2).to(dtype)
