"""Fuzzed packs: flipped bits, truncations, extensions and reordered sections in every region
of the file are each refused with a typed PackError, and nothing is ever installed."""
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packutil import make_planes, plane_state, same_state, split, synthetic_snapshot

from muser.cache import snapshot as cut
from muser.errors import PackError
from muser.pack import format as pf
from muser.pack import reader as pr

KEY = b"fuzz-key"


def regions(data: bytes) -> dict[str, tuple[int, int]]:
    """Named [start, end) byte ranges covering the whole file."""
    n, _, manifest, _, _ = split(data)
    head = data[8:8 + n]
    meta = 8 + head.index(b'"__metadata__"')
    auth = 8 + head.index(b'"muser.auth":"')
    man = 8 + head.index(b'"muser.pack":"')
    body_end = 8 + len(head.rstrip(b" "))
    out = {"length prefix": (0, 8), "tensor entries": (8, meta), "metadata key": (meta, auth),
           "seal": (auth, man), "manifest": (man, body_end)}
    if body_end < 8 + n:
        out["padding"] = (body_end, 8 + n)
    for p in manifest["planes"]:
        for which in ("keys", "values"):
            e = p[which]
            out[f"L{p['layer']} {which}"] = (8 + n + e["offset"], 8 + n + e["offset"] + e["length"])
    assert sorted(out.values())[-1][1] == len(data)
    return out


def base(signed: bool):
    snap, _ = synthetic_snapshot(position=11)
    return snap, pf.pack_to_bytes(snap, key=KEY if signed else None)


def mutations(data: bytes, seed: int):
    """(label, mutated bytes) across every region: bit flips, truncations, extensions, reorders."""
    rng = random.Random(seed)
    reg = regions(data)
    n = split(data)[0]
    for name, (a, b) in reg.items():
        for _ in range(max(12, min(60, (b - a) // 4))):
            i = rng.randrange(a, b)
            bit = rng.randrange(8)
            m = bytearray(data)
            m[i] ^= 1 << bit
            yield f"flip {name} byte {i} bit {bit}", bytes(m)
        for cut_at in {a, (a + b) // 2, b - 1}:
            yield f"truncate in {name} at {cut_at}", data[:cut_at]
        m = bytearray(data)
        m[a:b] = bytes(rng.randrange(256) for _ in range(b - a))
        yield f"scramble {name}", bytes(m)
        yield f"delete {name}", data[:a] + data[b:]
        yield f"duplicate {name}", data[:b] + data[a:b] + data[b:]
    for k in sorted(rng.sample(range(len(data)), 40)):
        yield f"truncate at {k}", data[:k]
    for extra in (b"\x00", b" ", b"\x00" * 8, bytes(range(100)), data[8 + n:], data):
        yield f"extend by {len(extra)}", data + extra
    for k in (8, 8 + n // 2, 8 + n, len(data) - 1):
        yield f"insert byte at {k}", data[:k] + b"\x00" + data[k:]
    tensors = [v for k, v in reg.items() if k.startswith("L")]
    for i in range(len(tensors)):
        for j in range(i + 1, len(tensors)):
            (a0, a1), (b0, b1) = tensors[i], tensors[j]
            if a1 - a0 == b1 - b0:
                yield f"swap tensors {i} and {j}", data[:a0] + data[b0:b1] + data[a1:b0] + data[a0:a1] + data[b1:]
    d0 = 8 + n
    yield "data before header", data[:8] + data[d0:] + data[8:d0]
    yield "data reversed by tensor", data[:d0] + b"".join(data[a:b] for a, b in reversed(tensors))
    yield "rotate data", data[:d0] + data[d0 + 16:] + data[d0:d0 + 16]
    yield "manifest and seal swapped", swap_meta(data)
    yield "empty", b""


def swap_meta(data: bytes) -> bytes:
    """Swap the manifest and seal strings inside the header, fixing up the length prefix."""
    import struct
    n, header, *_ = split(data)
    meta = header["__metadata__"]
    meta["muser.pack"], meta["muser.auth"] = meta["muser.auth"], meta["muser.pack"]
    import json
    body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body + data[8 + n:]


def refuse_all(cases, key):
    planes = make_planes("ring")
    before = plane_state(planes)
    wrong, count = [], 0
    for label, blob in cases:
        count += 1
        try:
            snap = pr.pack_from_bytes(blob, key=key)
        except PackError:
            continue
        except Exception as e:                            # untyped: a bug
            wrong.append(f"{label}: {type(e).__name__}: {e}")
            continue
        cut.install(snap, planes, snap.encoding)          # it would be installed: a bug
        wrong.append(f"{label}: loaded")
    assert same_state(plane_state(planes), before)
    return count, wrong


@pytest.mark.parametrize("signed", [False, True])
def test_every_mutation_in_every_region_is_refused(signed):
    snap, data = base(signed)
    assert pr.pack_from_bytes(data, key=KEY if signed else None).equal(snap)
    assert len(regions(data)) >= 11
    count, wrong = refuse_all(mutations(data, seed=int(signed)), KEY if signed else None)
    assert count >= 300 and not wrong, f"{len(wrong)} of {count} mutations not refused:\n" + "\n".join(wrong[:20])


def test_signed_pack_mutations_refused_without_a_key_too():
    _, data = base(True)
    count, wrong = refuse_all(mutations(data, seed=7), None)
    assert count >= 300 and not wrong, "\n".join(wrong[:20])


def test_every_single_bit_of_a_small_pack_is_covered():
    """Exhaustive: each of the first 8 + header bytes and a sample of data bytes, every bit."""
    snap, _ = synthetic_snapshot(position=2, n=1, kv=1, d=1, model={})
    data = pf.pack_to_bytes(snap)
    n = split(data)[0]
    cases = ((f"byte {i} bit {b}", data[:i] + bytes([data[i] ^ (1 << b)]) + data[i + 1:])
             for i in range(len(data)) for b in range(8))
    count, wrong = refuse_all(cases, None)
    assert count == 8 * (8 + n + 16) and not wrong, "\n".join(wrong[:20])


_, SIGNED = base(True)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_multi_edit_mutations_are_refused(data):
    blob = bytearray(SIGNED)
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["set", "insert", "delete"]))
        i = data.draw(st.integers(0, len(blob) - 1))
        if kind == "set":
            v = data.draw(st.integers(0, 255).filter(lambda x: x != blob[i]))
            blob[i] = v
        elif kind == "insert":
            blob[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        else:
            del blob[i:i + data.draw(st.integers(1, 64))]
    if bytes(blob) == SIGNED:
        return
    for key in (KEY, None):
        with pytest.raises(PackError):
            pr.pack_from_bytes(bytes(blob), key=key)
