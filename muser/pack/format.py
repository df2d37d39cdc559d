"""Session packs on disk: the byte layout, durable writes, and checked reads.

Owns: turning a `SessionSnapshot` into the bytes of one file and back, with every
check done before a snapshot is returned (nothing is ever installed from a pack
that failed one).  Does not own: the manifest's fields, the seal and the model
gate (muser.pack.manifest), nor installing a cut (muser.cache.snapshot).

A pack is a valid safetensors file (any safetensors reader loads its tensors).
Byte for byte, version 1.0:

    offset   size  content
    0        8     N: header length, unsigned 64-bit little-endian; N % 8 == 0, N <= 64 MiB
    8        N     header: canonical JSON (sorted keys, separators "," and ":", ASCII only,
                   no NaN) followed by 0-7 spaces (0x20) so that 8 + N is a multiple of 8
    8 + N    D     data: every plane's keys then values, planes in manifest order, back to back
    total    8 + N + D bytes exactly: nothing before, between or after

The header object (the safetensors header)::

    {"L0003.k": {"data_offsets": [b, e], "dtype": "F32", "shape": [count, kv_heads, head_dim]},
     "L0003.v": {...},                      one pair per plane, named by layer (4+ digits)
     ...,
     "__metadata__": {"muser.auth": "<seal JSON>", "muser.pack": "<manifest JSON>"}}

`data_offsets` are relative to offset 8 + N and equal the manifest's offset and
offset + length; dtype is F32 | BF16 | F16.  The metadata values are strings
(safetensors requires it): the manifest and the seal, themselves canonical
JSON -- see muser.pack.manifest for their fields.  Each tensor is
`count * kv_heads * head_dim` little-endian elements in row-major order [row,
head, dim], rows in logical order: row i holds position start + i.  No rotation
is stored; `Plane.install` rebuilds it, so a growing plane may be installed into
storage of any capacity (relocation is a copy).

Reading checks, in order, and refuses with a typed PackError at the first failure:
length prefix and file size; header JSON; format and major version (PackVersionError,
before anything else is trusted); the seal (manifest SHA-256, then HMAC-SHA256
when a key is given: PackAuthError); the header is byte-for-byte the canonical
encoding and names exactly the manifest's tensors; every manifest field
(PackShapeError / PackIntegrityError); total length; every tensor's SHA-256;
then, if asked, the model fingerprint and the encoding.

Writing goes to a temporary file in the target's directory (mode 0600), fsynced,
then os.replace'd over the target, then the directory is fsynced: a crash leaves
either the old file or the new one, and a partial temporary never loads (its
length cannot match its header).  Temporaries are named `.<name>.<writer pid>.<random>.tmp`;
after a successful save, those of the same target whose writer is no longer
running (killed mid-save) are removed.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch

from ..cache.snapshot import Encoding, PlaneCut, SessionSnapshot
from ..errors import PackEncodingMismatch, PackError, PackIntegrityError, PackShapeError
from . import manifest as mf
from .manifest import check_model

log = logging.getLogger("muser.pack")
MAX_HEADER = 64 << 20
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _little_endian() -> None:
    if sys.byteorder != "little":
        raise PackError(f"pack byte order expected little-endian host, found {sys.byteorder}")


def _name(layer: int, which: str) -> str:
    return f"L{layer:04d}.{which[0]}"


def _bytes_of(t: torch.Tensor):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def _sha(buf) -> str:
    return hashlib.sha256(memoryview(buf)).hexdigest()


def _header(manifest: dict, seal: dict) -> bytes:
    entries = {"__metadata__": {"muser.pack": mf.canonical(manifest).decode("ascii"),
                                "muser.auth": mf.canonical(seal).decode("ascii")}}
    code = mf.DTYPES[manifest["encoding"]["dtype"]][0]
    for p in manifest["planes"]:
        for which in ("keys", "values"):
            t = p[which]
            entries[_name(p["layer"], which)] = {"dtype": code, "shape": p["shape"],
                                                 "data_offsets": [t["offset"], t["offset"] + t["length"]]}
    body = mf.canonical(entries)
    return body + b" " * (-len(body) % 8)


def _buffers(snap: SessionSnapshot) -> list:
    """Every tensor's bytes in data order, after checking the snapshot is self-consistent."""
    _little_endian()
    want = _TORCH.get(snap.encoding.dtype)
    if want is None:
        raise PackShapeError(-1, "encoding dtype", sorted(_TORCH), snap.encoding.dtype)
    bufs = []
    for cut in snap.planes:
        for name, t in (("keys", cut.keys), ("values", cut.values)):
            if t.dtype != want:
                raise PackShapeError(cut.layer, f"{name} dtype", want, t.dtype)
            if t.dim() != 3 or t.shape[0] != cut.count or t.shape != cut.keys.shape:
                raise PackShapeError(cut.layer, f"{name} shape", [cut.count, "KV", "D"], list(t.shape))
            bufs.append(_bytes_of(t))
    return bufs


def _head(snap: SessionSnapshot, digests: list[str], key, meta: dict | None = None) -> bytes:
    """Length prefix + header.  Its length does not depend on the digests (fixed-width hex)."""
    manifest = mf.build(snap, list(zip(digests[0::2], digests[1::2])), meta)
    mf.validate(manifest)           # never write what we would refuse to read
    header = _header(manifest, mf.seal(mf.canonical(manifest), key))
    return struct.pack("<Q", len(header)) + header


def _write(snap: SessionSnapshot, key, f, meta: dict | None = None) -> None:
    """Write the pack to seekable `f`: the data first (hashed on a pool while it is written),
    then the header into the space reserved for it."""
    bufs = _buffers(snap)
    reserved = len(_head(snap, ["0" * 64] * len(bufs), key, meta))
    f.seek(reserved)
    with ThreadPoolExecutor(_WORKERS) as pool:
        futures = [pool.submit(_sha, b) for b in bufs]
        for b in bufs:
            f.write(memoryview(b))
        head = _head(snap, [fu.result() for fu in futures], key, meta)
    if len(head) != reserved:
        raise PackError(f"header length expected {reserved} bytes, found {len(head)} (writer bug)")
    f.seek(0)
    f.write(head)


def pack_to_bytes(snap: SessionSnapshot, key=None, meta: dict | None = None) -> bytes:
    f = io.BytesIO()
    _write(snap, key, f, meta)
    return f.getvalue()


def save_pack(snap: SessionSnapshot, path, key=None, meta: dict | None = None) -> None:
    """Write `snap` (and the optional `meta` object, sealed with the manifest) to `path`
    atomically and durably (see the module docstring).  The temporary is created with
    O_EXCL and mode 0600 (never through a link); os.replace swaps the name itself, so a
    symbolic link at `path` is replaced, never followed."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.{os.getpid()}.", suffix=".tmp", dir=directory)
    try:
        with open(fd, "wb") as f:
            _write(snap, key, f, meta)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    _remove_stale_temporaries(directory, name)


def _remove_stale_temporaries(directory: str, name: str) -> None:
    """Delete `.<name>.<pid>.*.tmp` left by writers that are gone (a live writer's is kept)."""
    prefix = f".{name}."
    for entry in os.listdir(directory):
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        pid = entry[len(prefix):].split(".", 1)[0]
        if not pid.isdigit() or pid_alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(directory, entry))
        except OSError:
            pass


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (a writer whose temporary file must be kept)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:          # exists, owned by someone else
        return True
    return True


# ---------------------------------------------------------------------------- reading
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
