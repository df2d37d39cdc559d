"""A fast, read-only GGUF header parser over a memory map.

Owns: reading a GGUF's metadata and tensor table, and handing out each
tensor's bytes as a zero-copy numpy view shaped the way `gguf.GGUFReader`
shapes its `.data` (so `gguf.quants.dequantize(t.data, t.tensor_type)` works).
Does not own: dequantization (`dequant`) or name mapping (`gguf_loader`).

Why not `gguf.GGUFReader`: it builds two numpy views per string of every
string array, and Gemma 3's 262,144-token vocabulary makes that 10-19 s on
these machines.  Here string arrays are skipped by walking their lengths and
decoded only on request (`strings(key)`), so opening the file takes well under
a second.  Numeric arrays are numpy views.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from muser.errors import ModelFormatError

# GGUF metadata value types -> struct format
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
       7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
# tensor types stored as plain numpy elements (GGUFReader gives these typed, not as bytes)
_PLAIN = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
          GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class StringArray:
    """A string array left undecoded: `count` strings starting at byte `offset`."""
    offset: int
    count: int


@dataclass
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]      # ggml order, fastest-moving first (as GGUFReader reports it)
    n_elements: int
    n_bytes: int
    data: np.ndarray            # plain types: typed [rows.., cols]; quantized: uint8 [rows.., bytes_per_row]

    @property
    def torch_shape(self) -> tuple[int, ...]:
        """Shape in torch order: [rows, cols] for a matrix (= [out_features, in_features])."""
        return tuple(reversed(self.shape))


class GGUFFile:
    """`fields`: metadata key -> value (scalars as Python values, numeric arrays as numpy
    arrays, string arrays as `StringArray` placeholders); `tensors`: list of `GGUFTensor`."""

    def __init__(self, path):
        self.path = Path(path)
        self._mm = np.memmap(self.path, mode="r", dtype=np.uint8)
        buf = self._mm
        if bytes(buf[:4]) != b"GGUF":
            raise ModelFormatError(f"{self.path} is not a GGUF file (bad magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ModelFormatError(f"{self.path}: GGUF version {version} is not supported (2, 3)")
        pos = 24
        self.fields: dict[str, object] = {}
        for _ in range(n_kv):
            key, pos = self._str(pos)
            (vtype,) = struct.unpack_from("<I", buf, pos)
            self.fields[key], pos = self._value(pos + 4, vtype)
        infos = []
        for _ in range(n_tensors):
            name, pos = self._str(pos)
            (nd,) = struct.unpack_from("<I", buf, pos)
            dims = struct.unpack_from(f"<{nd}Q", buf, pos + 4)
            ttype, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            infos.append((name, tuple(int(d) for d in dims), GGMLQuantizationType(ttype), off))
        align = int(self.fields.get("general.alignment", 32))
        data_start = (pos + align - 1) // align * align
        self.tensors: list[GGUFTensor] = [self._tensor(*i, data_start) for i in infos]
        self._by_name = {t.name: t for t in self.tensors}

    # ---------------------------------------------------------------- parsing
    def _str(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self._mm, pos)
        return bytes(self._mm[pos + 8: pos + 8 + n]).decode("utf-8", errors="replace"), pos + 8 + n

    def _value(self, pos: int, vtype: int):
        if vtype in _SCALAR:
            (v,) = struct.unpack_from(_SCALAR[vtype], self._mm, pos)
            return v, pos + struct.calcsize(_SCALAR[vtype])
        if vtype == 8:
            return self._str(pos)
        if vtype != 9:
            raise ModelFormatError(f"{self.path}: unknown metadata type {vtype}")
        etype, count = struct.unpack_from("<IQ", self._mm, pos)
        pos += 12
        if etype in _NP:
            size = np.dtype(_NP[etype]).itemsize * count
            return self._mm[pos: pos + size].view(_NP[etype]), pos + size
        if etype == 8:                       # walk the lengths; decode on request
            start = pos
            for _ in range(count):
                (n,) = struct.unpack_from("<Q", self._mm, pos)
                pos += 8 + n
            return StringArray(start, count), pos
        vals = []                            # array of arrays: rare, decode eagerly
        for _ in range(count):
            v, pos = self._value(pos, etype)
            vals.append(v)
        return vals, pos

    def _tensor(self, name, dims, ttype, off, data_start) -> GGUFTensor:
        n = int(np.prod(dims)) if dims else 1
        block, tsize = GGML_QUANT_SIZES[ttype]
        nbytes = n // block * tsize
        raw = self._mm[data_start + off: data_start + off + nbytes]
        rows = tuple(reversed(dims[1:]))
        if ttype in _PLAIN:
            data = raw.view(_PLAIN[ttype]).reshape(*rows, dims[0])
        else:
            data = raw.reshape(*rows, dims[0] // block * tsize)
        return GGUFTensor(name, ttype, dims, n, nbytes, data)

    # ---------------------------------------------------------------- access
    def strings(self, key: str) -> list[str]:
        """Decode a string array (e.g. `tokenizer.ggml.tokens`)."""
        v = self.fields[key]
        if not isinstance(v, StringArray):
            raise ModelFormatError(f"{key} is not a string array")
        out, pos = [], v.offset
        for _ in range(v.count):
            s, pos = self._str(pos)
            out.append(s)
        return out

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise ModelFormatError(f"{self.path.name}: no tensor named {name!r}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._by_name
