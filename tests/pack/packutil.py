"""Builders for the session-pack tests: synthetic cache planes and cuts, no model.

Owns: `layer_map`, `make_planes`, `fill`, `synthetic_snapshot`, `FINGERPRINT`.
Does not own fixtures (conftest.py) or any assertion.
"""
from __future__ import annotations

import torch

from muser.cache import Encoding, build_planes
from muser.cache import snapshot as cut
from muser.config import LayerSpec

FINGERPRINT = {"architecture": "test", "layers": [["sliding", 4, True], ["sliding", 4, True],
                                                  ["full", None, True]],
               "kv_heads": 2, "head_dim": 8, "weights_digest": "ab" * 32}


def layer_map(window: int = 4, n: int = 3):
    return tuple(LayerSpec(i, "full" if (i + 1) % 3 == 0 else "sliding",
                           None if (i + 1) % 3 == 0 else window, True) for i in range(n))


def make_planes(family="ring", window=4, max_context=64, kv=2, d=8, dtype=torch.float32, n=3):
    return build_planes(layer_map(window, n), family, max_context, kv, d, dtype, "cpu")


def row(p, seed: int, pos: int):
    g = torch.Generator().manual_seed(seed * 1000003 + p.layer * 10007 + pos)
    return (torch.randn(1, p.kv_heads, p.head_dim, generator=g).to(p.dtype),
            torch.randn(1, p.kv_heads, p.head_dim, generator=g).to(p.dtype))


def fill(planes, upto: int, seed: int = 0, chunk: int = 3) -> None:
    """Store deterministic random rows until every plane ends at `upto` (rows depend only on position)."""
    for p in planes:
        pos = p.end
        while pos < upto:
            n = min(chunk, upto - pos)
            k, v = zip(*(row(p, seed, q) for q in range(pos, pos + n)))
            k, v = torch.cat(k), torch.cat(v)
            p.store(pos, k, v)
            pos += n


def synthetic_snapshot(position=11, family="ring", dtype=torch.float32, model=None, **kw):
    planes = make_planes(family, dtype=dtype, **kw)
    fill(planes, position)
    enc = Encoding(family, str(dtype).removeprefix("torch."))
    return cut.take(planes, position, enc, tokens=tuple(range(100, 100 + position)),
                    model=FINGERPRINT if model is None else model), planes




def split(data: bytes):
    """(header length N, header dict, manifest dict, seal dict, data bytes) of a pack."""
    import json
    import struct
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header["__metadata__"]
    return n, header, json.loads(meta["muser.pack"]), json.loads(meta["muser.auth"]), data[8 + n:]


def reseal(data: bytes, edit, key=None, body: bytes | None = None) -> bytes:
    """Rebuild a pack after `edit(manifest)` with a fresh, valid seal (what a forger without
    the key can do, or a newer writer).  `body` replaces the data section."""
    import struct
    from muser.pack import format as pf
    from muser.pack import manifest as mf
    _, _, manifest, _, rest = split(data)
    edit(manifest)
    header = pf._header(manifest, mf.seal(mf.canonical(manifest), key))
    return struct.pack("<Q", len(header)) + header + (rest if body is None else body)


def plane_state(planes):
    """Everything observable about planes: bookkeeping and every live row in physical order."""
    out = []
    for p in planes:
        if p.kind == "ring":
            rows = (p.keys.clone(), p.values.clone())
        else:
            rows = (p.keys[:, :p.len].clone(), p.values[:, :p.len].clone())
        out.append((p.metadata(), rows))
    return out


def same_state(a, b) -> bool:
    return len(a) == len(b) and all(ma == mb and all(torch.equal(x, y) for x, y in zip(ra, rb))
                                    for (ma, ra), (mb, rb) in zip(a, b))
