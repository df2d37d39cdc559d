"""Routing keys: chained hashes of token-id blocks, and hashed session ids.

Owns: `block_keys(tokens, block)` -- key i (0-based) is a 64-bit hash of
key i-1 and tokens [i*block, (i+1)*block); so one key names a whole prefix, a
replica's key set is prefix-closed, and two sequences share key i exactly when
(up to a 2^-64 collision) they share their first (i+1)*block tokens -- and
`session_key(header)` (a short hash: raw client ids never leave the ingress).
Only full blocks get keys: the ragged tail of a prompt routes by its blocks.
Does not own: which replica holds what (replicas publish, router.py reads).
"""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

SEED = b"muser-route-v1"


def block_keys(tokens: Sequence[int], block: int) -> list[int]:
    """Keys of every full `block`-token prefix of `tokens`: len(tokens) // block of them."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    out: list[int] = []
    prev = hashlib.blake2b(SEED, digest_size=8).digest()
    n = len(tokens) // block
    for i in range(n):
        chunk = array("q", tokens[i * block:(i + 1) * block]).tobytes()
        prev = hashlib.blake2b(prev + chunk, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def extend_keys(keys: list[int], tokens: Sequence[int], block: int) -> list[int]:
    """`block_keys(tokens, block)`, reusing `keys` already computed for a prefix of `tokens`."""
    have = len(keys)
    n = len(tokens) // block
    if have >= n:
        return keys[:n]
    out = list(keys)
    prev = (keys[-1].to_bytes(8, "little") if keys
            else hashlib.blake2b(SEED, digest_size=8).digest())
    for i in range(have, n):
        chunk = array("q", tokens[i * block:(i + 1) * block]).tobytes()
        prev = hashlib.blake2b(prev + chunk, digest_size=8).digest()
        out.append(int.from_bytes(prev, "little"))
    return out


def matched_blocks(keys: Sequence[int], held: set[int] | frozenset[int]) -> int:
    """How many leading blocks of a request (its `keys`) a replica holding `held` has.

    `held` is prefix-closed (a key implies every earlier key of its sequence), so
    membership is monotone along `keys` and a binary search finds the boundary."""
    lo, hi = 0, len(keys)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if keys[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


def session_key(raw: str | None) -> str | None:
    """16 hex digits naming a client session id; None for no (or an empty) id."""
    if raw is None or not raw.strip():
        return None
    return hashlib.blake2b(raw.strip().encode("utf-8", "surrogatepass"), digest_size=8,
                           person=b"muser-session").hexdigest()
