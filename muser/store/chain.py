"""Content addresses: the store's namespace, the hash chain over token-id blocks, cut keys.

Owns: `namespace(...)` (what makes two cuts comparable at all: the model fingerprint, the cut
encoding, the plane layout and the block size), `root`, `link` and `chain` (the hash chain),
`cut_key` and `content_digest` (which bits a block holds).  Pure functions of bytes; no tensors
are read here except by `content_digest`.

The chain, for block size B over token ids t:
    h[0]   = SHA-256("muser.store/1" || namespace)
    h[i+1] = SHA-256(h[i] || t[iB:(i+1)B] as int32 little-endian)
so h[i] names the exact token prefix t[:iB] *and* the namespace: equal chains mean equal ids
under the same model and encoding.  A cut at position p = kB + r is keyed by
    SHA-256("cut" || h[k] || t[kB:p] as int32 LE)
A block's rows depend on every earlier token (attention), which the chain captures; they can
still differ bit for bit when the same ids were computed in other chunks (see objects.py), so a
block is identified by (chain, content digest).
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Sequence

import torch

MAGIC = b"muser.store/1"


def namespace(fingerprint: dict, encoding: str, layout: Sequence[tuple], block_size: int) -> str:
    """Hex digest of everything a cut's bytes depend on besides the token ids."""
    record = {"model": fingerprint, "encoding": encoding, "layout": [list(p) for p in layout],
              "block_size": block_size}
    blob = json.dumps(record, sort_keys=True, separators=(",", ":")).encode("ascii")
    return hashlib.sha256(blob).hexdigest()


def _ids_bytes(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


def root(ns: str) -> bytes:
    return hashlib.sha256(MAGIC + ns.encode("ascii")).digest()


def link(parent: bytes, ids: Sequence[int]) -> bytes:
    return hashlib.sha256(parent + _ids_bytes(ids)).digest()


def chain(ns_root: bytes, ids: Sequence[int], block_size: int, blocks: int | None = None) -> list[bytes]:
    """[h0, h1, ..., hk] for the first `blocks` complete blocks of `ids` (default: all)."""
    k = len(ids) // block_size if blocks is None else blocks
    out = [ns_root]
    for i in range(k):
        out.append(link(out[-1], ids[i * block_size:(i + 1) * block_size]))
    return out


def cut_key(base: bytes, tail: Sequence[int]) -> bytes:
    return hashlib.sha256(b"cut" + base + _ids_bytes(tail)).digest()


def digest_of_shas(shas: Sequence[str]) -> str:
    """A block's content digest from its tensors' SHA-256s (keys then values, layer order):
    the same string a pack manifest lets a reader compute without reading the tensors."""
    return hashlib.sha256("".join(shas).encode("ascii")).hexdigest()


def content_digest(tensors) -> str:
    """`digest_of_shas` of tensors in memory (the bytes a pack would hold)."""
    shas = []
    for t in tensors:
        buf = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        shas.append(hashlib.sha256(memoryview(buf)).hexdigest())
    return digest_of_shas(shas)
