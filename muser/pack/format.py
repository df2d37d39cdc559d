"""Session packs on disk: the byte layout and durable writes.

Owns: the byte layout (below) and turning a `SessionSnapshot` into the bytes of one
file (`pack_to_bytes`) or into one file written atomically and durably (`save_pack`),
with the snapshot checked first (never write what a reader would refuse).  Does not
own: reading a pack back and the order of its checks (moved to muser.pack.reader:
`read_pack`, `verify`, `load_pack`, `pack_from_bytes`, `load_with_manifest`,
`read_manifest`), the manifest's fields, the seal and the model gate
(muser.pack.manifest), nor installing a cut (muser.cache.snapshot).

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

What a reader checks, and in which order, is muser.pack.reader's docstring.

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
import os
import struct
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import torch

from ..cache.snapshot import SessionSnapshot
from ..errors import PackError, PackShapeError
from . import manifest as mf

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
