"""Reading a session pack back: every check, in order, before a snapshot is returned.

Owns: the checked reads of a pack from a path, bytes or an open binary file --
`read_pack`, `verify`, `load_pack`, `pack_from_bytes` and `load_with_manifest` (every
check, every tensor digest) and `read_manifest` (the header checks only) -- and the
order of the checks: nothing is ever installed from a pack that failed one.
Does not own: the byte layout and writing (muser.pack.format documents the file byte
for byte), the manifest's fields, the seal and the model gate (muser.pack.manifest),
nor installing a cut (muser.cache.snapshot).

Reading checks, in order, and refuses with a typed PackError at the first failure:
length prefix and file size; header JSON; format and major version (PackVersionError,
before anything else is trusted); the seal (manifest SHA-256, then HMAC-SHA256
when a key is given: PackAuthError); the header is byte-for-byte the canonical
encoding and names exactly the manifest's tensors; every manifest field
(PackShapeError / PackIntegrityError); total length; every tensor's SHA-256;
then, if asked, the model fingerprint and the encoding.
"""
from __future__ import annotations

import io
import json
import logging
import os
import struct
from concurrent.futures import ThreadPoolExecutor

import torch

from ..cache.snapshot import Encoding, PlaneCut, SessionSnapshot
from ..errors import PackEncodingMismatch, PackIntegrityError
from . import manifest as mf
from .format import _TORCH, _WORKERS, MAX_HEADER, _header, _little_endian, _sha
from .manifest import check_model

log = logging.getLogger("muser.pack")


def _read_exact(f, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise PackIntegrityError(f"{what} expected {n} bytes, found {len(data)} (file truncated)")
    return data


def _read_header(f, size: int, key) -> tuple[dict, str, int, int]:
    """Everything up to (not including) the tensor bytes.  Returns (manifest, auth state, N, D)."""
    _little_endian()
    if size < 8:
        raise PackIntegrityError(f"file length expected at least 8 bytes, found {size}")
    (n,) = struct.unpack("<Q", _read_exact(f, 8, "length prefix"))
    if n > min(MAX_HEADER, size - 8) or n % 8 or n == 0:
        raise PackIntegrityError(f"header length expected a multiple of 8 in [8, "
                                 f"{min(MAX_HEADER, size - 8)}], found {n}")
    raw = _read_exact(f, n, "header")
    try:
        header = json.loads(raw.decode("ascii"))
        meta = header["__metadata__"]
        body = meta["muser.pack"].encode("ascii")
        manifest, seal = json.loads(body), json.loads(meta["muser.auth"])
    except (UnicodeError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise PackIntegrityError(f"header expected safetensors JSON with muser.pack and muser.auth "
                                 f"metadata, found unreadable bytes ({type(e).__name__}: {e})"[:300]) from None
    mf.check_version(manifest)
    state = mf.unseal(body, seal, key)
    if set(meta) != {"muser.pack", "muser.auth"}:
        raise PackIntegrityError(f"metadata keys expected ['muser.auth', 'muser.pack'], found {sorted(meta)}")
    data_len = mf.validate(manifest)
    if _header(manifest, seal) != raw:
        raise PackIntegrityError("header expected the canonical encoding of its manifest, found other bytes "
                                 "(altered tensor entries, key order, spacing or padding)")
    if size != 8 + n + data_len:
        raise PackIntegrityError(f"file length expected {8 + n + data_len} bytes, found {size} "
                                 f"({'truncated' if size < 8 + n + data_len else 'trailing bytes'})")
    return manifest, state, n, data_len


def _read_tensors(f, manifest: dict) -> list[torch.Tensor]:
    """Read every tensor, hashing on a pool while the next one is read; verify every digest."""
    dtype = _TORCH[manifest["encoding"]["dtype"]]
    specs = [(p, w) for p in manifest["planes"] for w in ("keys", "values")]
    bufs, futures = [], []
    with ThreadPoolExecutor(_WORKERS) as pool:
        for p, which in specs:
            length = p[which]["length"]
            buf = torch.empty(length, dtype=torch.uint8)
            view, got = memoryview(buf.numpy()), 0
            while got < length:
                k = f.readinto(view[got:])
                if not k:
                    raise PackIntegrityError(f"layer {p['layer']} {which} expected {length} bytes, "
                                             f"found {got} (file truncated)")
                got += k
            bufs.append(buf)
            futures.append(pool.submit(_sha, buf.numpy()))
        digests = [fu.result() for fu in futures]
    for (p, which), digest in zip(specs, digests):
        if digest != p[which]["sha256"]:
            raise PackIntegrityError(f"layer {p['layer']} {which} sha256 expected {p[which]['sha256'][:16]}.., "
                                     f"found {digest[:16]}..: tensor bytes altered")
    return [b.view(dtype).reshape(p["shape"]) for b, (p, _) in zip(bufs, specs)]


def _decode(f, size: int, key, expect_model, expect_encoding) -> tuple[SessionSnapshot, str, dict]:
    manifest, state, _, _ = _read_header(f, size, key)
    tensors = _read_tensors(f, manifest)
    planes = tuple(PlaneCut(p["layer"], p["kind"], p["window"], p["start"], p["count"], k, v)
                   for p, k, v in zip(manifest["planes"], tensors[0::2], tensors[1::2]))
    enc = manifest["encoding"]
    snap = SessionSnapshot(manifest["position"], Encoding(enc["family"], enc["dtype"]), planes,
                           tuple(manifest["tokens"]), manifest["model"])
    if expect_model:
        check_model(snap, expect_model)
    if expect_encoding is not None and snap.encoding != expect_encoding:
        raise PackEncodingMismatch(str(expect_encoding), str(snap.encoding))
    log.debug("loaded session pack at position %d: %s", snap.position, state)
    return snap, state, manifest


def _open(source):
    """(binary file, size) for a path, bytes, or an open binary file (which is then closed)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source), len(source)
    if hasattr(source, "readinto") and hasattr(source, "fileno"):
        return source, os.fstat(source.fileno()).st_size
    f = open(source, "rb")
    return f, os.fstat(f.fileno()).st_size


def read_pack(source, key=None, expect_model: dict | None = None,
              expect_encoding: Encoding | None = None) -> tuple[SessionSnapshot, str, dict | None]:
    """Full check of a pack (path, bytes or open file): (snapshot, authentication state in
    words, the manifest's `meta` object or None)."""
    f, size = _open(source)
    with f:
        snap, state, manifest = _decode(f, size, key, expect_model, expect_encoding)
    return snap, state, manifest.get("meta")


def load_with_manifest(path, key=None, expect_model: dict | None = None,
                       expect_encoding: Encoding | None = None) -> tuple[SessionSnapshot, dict]:
    """Every check of `verify`; returns the snapshot and the manifest it was read with (so a
    reader of optional fields sees exactly the authenticated ones)."""
    f, size = _open(path)
    with f:
        snap, _, manifest = _decode(f, size, key, expect_model, expect_encoding)
    return snap, manifest


def verify(source, key=None, expect_model: dict | None = None,
           expect_encoding: Encoding | None = None) -> tuple[SessionSnapshot, str]:
    """Full check of a pack (path, bytes or open file): (snapshot, authentication state in words)."""
    return read_pack(source, key, expect_model, expect_encoding)[:2]


def load_pack(path, key=None, expect_model: dict | None = None,
              expect_encoding: Encoding | None = None) -> SessionSnapshot:
    return verify(path, key, expect_model, expect_encoding)[0]


def pack_from_bytes(data, key=None, expect_model: dict | None = None,
                    expect_encoding: Encoding | None = None) -> SessionSnapshot:
    return verify(bytes(data) if isinstance(data, memoryview) else data, key, expect_model, expect_encoding)[0]


def read_manifest(source, key=None) -> dict:
    """Header-only check (no tensor digests): manifest, auth state and the section sizes."""
    f, size = _open(source)
    with f:
        manifest, state, n, d = _read_header(f, size, key)
    return {"manifest": manifest, "auth": state, "header_bytes": n, "data_bytes": d, "file_bytes": size}
