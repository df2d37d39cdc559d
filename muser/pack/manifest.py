"""The session pack manifest: what it holds, how it is authenticated, and the model gate.

Owns: building the manifest dict from a `SessionSnapshot` (`build`), checking a
parsed manifest field by field before any tensor byte is trusted (`validate`),
the integrity/authenticity record (`seal`, `unseal`), the model-fingerprint
gate (`check_model`) and key loading (`load_key`).
Does not own: bytes on disk, the safetensors container or durability
(muser.pack.format documents the file byte for byte), nor installing a cut
(muser.cache.snapshot).

The manifest (canonical JSON: sorted keys, no spaces, ASCII) for version 1.0::

    format    "muser.pack"
    version   "1.0"                         major.minor; an unknown major is refused
    model     {} or the engine's fingerprint: architecture, layers [[kind, window, rope], ...],
              kv_heads, head_dim, weights_digest (opaque beyond check_model)
    encoding  {"family": "ring"|"oracle", "dtype": "float32"|"bfloat16"|"float16"}
    position  int >= 0
    tokens    [int, ...]                    the ids consumed (lineage; may be empty; -1 = unknown id)
    planes    [{layer, kind, window, start, count, dtype, shape: [count, kv_heads, head_dim],
                keys: {offset, length, sha256}, values: {offset, length, sha256}}, ...]

Offsets are relative to the start of the data section; tensors are laid out
in manifest order, keys then values, back to back from offset 0.  A minor
version may add optional fields anywhere in the manifest: readers ignore
fields they do not know.

The seal (`muser.auth` in the container metadata) is JSON {"hmac": H, "sha256": S}:
    H = HMAC-SHA256(key, manifest bytes) as lowercase hex, or "" for an unsigned pack
    S = SHA-256(manifest bytes || H as ASCII) as lowercase hex
S lets a reader without a key detect any flipped bit in the manifest or in H;
H is what a key holder trusts.  The manifest carries every tensor's SHA-256, so
authenticating the manifest authenticates every row.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re

from ..errors import (PackAuthError, PackIntegrityError, PackModelMismatch, PackShapeError,
                      PackVersionError)

FORMAT = "muser.pack"
VERSION = (1, 0)
DTYPES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "float16": ("F16", 2)}
KINDS = ("ring", "growing")
KEY_ENV = "MUSER_PACK_KEY"
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


def canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def build(snap, digests: list[tuple[str, str]], extra: dict | None = None) -> dict:
    """The manifest of `snap`; digests[i] = (keys sha256, values sha256) of plane i.

    `extra`: optional top-level fields a minor version may add (e.g. the cut store's
    `store` record); they may not replace a 1.0 field."""
    planes, offset = [], 0
    dtype = snap.encoding.dtype
    for cut, (dk, dv) in zip(snap.planes, digests):
        shape = [int(s) for s in cut.keys.shape]
        length = cut.keys.numel() * cut.keys.element_size()
        entry = dict(layer=int(cut.layer), kind=cut.kind, window=cut.window, start=int(cut.start),
                     count=int(cut.count), dtype=dtype, shape=shape)
        for name, digest in (("keys", dk), ("values", dv)):
            entry[name] = dict(offset=offset, length=length, sha256=digest)
            offset += length
        planes.append(entry)
    manifest = dict(format=FORMAT, version=f"{VERSION[0]}.{VERSION[1]}",
                    model=json.loads(json.dumps(snap.model)),
                    encoding=dict(family=snap.encoding.family, dtype=dtype), position=int(snap.position),
                    tokens=[int(t) for t in snap.tokens], planes=planes)
    for name, value in (extra or {}).items():
        if name in manifest:
            raise PackIntegrityError(f"extra manifest field expected a new name, found {name!r} (a 1.0 field)")
        manifest[name] = json.loads(json.dumps(value))
    return manifest


# ---------------------------------------------------------------------------- seal
def _as_key(key) -> bytes | None:
    if key is None:
        return None
    key = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not key:
        raise PackAuthError("pack key expected at least 1 byte, got an empty key")
    return key


def seal(manifest_bytes: bytes, key=None) -> dict:
    key = _as_key(key)
    mac = hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest() if key else ""
    return {"hmac": mac, "sha256": hashlib.sha256(manifest_bytes + mac.encode("ascii")).hexdigest()}


def unseal(manifest_bytes: bytes, auth, key=None) -> str:
    """Check the seal; returns the authentication state in words.  Raises before trusting anything."""
    key = _as_key(key)
    if not isinstance(auth, dict) or not isinstance(auth.get("hmac"), str) \
            or not isinstance(auth.get("sha256"), str) or set(auth) != {"hmac", "sha256"}:
        raise PackIntegrityError(f"seal expected {{'hmac': str, 'sha256': str}}, found {auth!r:.200}")
    mac = auth["hmac"]
    if mac and not _HEX64.match(mac):
        raise PackIntegrityError(f"seal hmac expected 64 lowercase hex digits or '', found {mac!r:.80}")
    found = hashlib.sha256(manifest_bytes + mac.encode("ascii")).hexdigest()
    if not hmac.compare_digest(found, auth["sha256"]):
        raise PackIntegrityError(f"manifest digest expected {auth['sha256'][:16]}.. (stored), "
                                 f"found {found[:16]}.. (computed): the manifest or its seal was altered")
    if key is None:
        return "signed, signature NOT verified (no key): integrity only" if mac \
            else "unsigned: integrity only"
    if not mac:
        raise PackAuthError("pack signature expected HMAC-SHA256 (a key was given), "
                            "found an unsigned pack")
    want = hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, mac):
        raise PackAuthError("pack signature expected an HMAC-SHA256 made with this key, "
                            "found one made with another key (or over other contents)")
    return "authenticated: HMAC-SHA256 verified"


def check_version(manifest) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise PackIntegrityError(f"format expected {FORMAT!r}, found {found!r:.80}")
    version = manifest.get("version")
    m = re.fullmatch(r"(\d{1,6})\.(\d{1,6})", version) if isinstance(version, str) else None
    if m is None:
        raise PackIntegrityError(f"version expected 'MAJOR.MINOR', found {version!r:.80}")
    if int(m.group(1)) != VERSION[0]:
        raise PackVersionError(f"pack format version expected {VERSION[0]}.x (this reader: "
                               f"{VERSION[0]}.{VERSION[1]}), found {version}")


# ---------------------------------------------------------------------------- validation
def _want(cond: bool, what: str, expected, found) -> None:
    if not cond:
        raise PackIntegrityError(f"{what} expected {expected}, found {found!r:.120}")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def validate(m: dict) -> int:
    """Every field the reader relies on, before a byte of data is read.  Returns the data length."""
    for name, typ in (("model", dict), ("encoding", dict), ("tokens", list), ("planes", list)):
        _want(isinstance(m.get(name), typ), name, typ.__name__, m.get(name))
    enc = m["encoding"]
    _want(isinstance(enc.get("family"), str), "encoding family", "a string", enc.get("family"))
    _want(enc.get("dtype") in DTYPES, "encoding dtype", f"one of {sorted(DTYPES)}", enc.get("dtype"))
    position = m.get("position")
    _want(_int(position), "position", "an int >= 0", position)
    _want(all(isinstance(t, int) and not isinstance(t, bool) and t >= -1 for t in m["tokens"]),
          "tokens", "a list of ints >= -1 (-1: unknown id)", "other values")
    itemsize = DTYPES[enc["dtype"]][1]
    offset, layers = 0, set()
    for i, p in enumerate(m["planes"]):
        _want(isinstance(p, dict), f"plane {i}", "an object", p)
        layer = p.get("layer")
        _want(_int(layer) and layer not in layers, f"plane {i} layer", "a new int >= 0", layer)
        layers.add(layer)
        _want(p.get("kind") in KINDS, f"layer {layer} kind", f"one of {KINDS}", p.get("kind"))
        window = p.get("window")
        _want(window is None or (_int(window) and window >= 1), f"layer {layer} window", "null or >= 1", window)
        start, count, shape = p.get("start"), p.get("count"), p.get("shape")
        _want(_int(start) and _int(count), f"layer {layer} start/count", "ints >= 0", (start, count))
        if start + count != position:
            raise PackShapeError(layer, "end position (start + count)", position, start + count)
        if p.get("dtype") != enc["dtype"]:
            raise PackShapeError(layer, "dtype", enc["dtype"], p.get("dtype"))
        _want(isinstance(shape, list) and len(shape) == 3 and all(_int(s) for s in shape),
              f"layer {layer} shape", "[count, kv_heads, head_dim]", shape)
        if shape[0] != count or shape[1] < 1 or shape[2] < 1:
            raise PackShapeError(layer, "shape", f"[{count}, >=1, >=1]", shape)
        length = count * shape[1] * shape[2] * itemsize
        for name in ("keys", "values"):
            t = p.get(name)
            _want(isinstance(t, dict), f"layer {layer} {name}", "an object", t)
            if t.get("offset") != offset:
                raise PackShapeError(layer, f"{name} offset", offset, t.get("offset"))
            if t.get("length") != length:
                raise PackShapeError(layer, f"{name} length", length, t.get("length"))
            _want(isinstance(t.get("sha256"), str) and _HEX64.match(t["sha256"]) is not None,
                  f"layer {layer} {name} sha256", "64 lowercase hex digits", t.get("sha256"))
            offset += length
    return offset


# ---------------------------------------------------------------------------- model gate
_SCALARS = (("architecture", "architecture"), ("kv_heads", "kv_heads"), ("head_dim", "head_dim"),
            ("weights_digest", "weights digest"))
_LAYER_FIELDS = ("kind", "window", "rope")


def _short(v):
    return v[:12] + ".." if isinstance(v, str) and len(v) > 16 else v


def check_model(snap_or_model, fingerprint: dict) -> None:
    """Raise PackModelMismatch naming the first field where the pack's model is not `fingerprint`.

    `snap_or_model` is a SessionSnapshot (its `.model`) or a fingerprint dict.
    Fields the engine's fingerprint holds must be present and equal in the pack;
    any further key present in both must be equal too.
    """
    got = getattr(snap_or_model, "model", snap_or_model)
    want, got = json.loads(json.dumps(fingerprint or {})), json.loads(json.dumps(got or {}))
    if want and not got:
        raise PackModelMismatch("model fingerprint expected one for "
                                f"{want.get('architecture', 'this model')}, got a pack without one")
    for key, label in _SCALARS:
        if key in want and want[key] != got.get(key, "none"):
            raise PackModelMismatch(f"{label} expected {_short(want[key])}, got {_short(got.get(key, 'none'))}")
    if "layers" in want:
        wl, gl = want["layers"], got.get("layers")
        if not isinstance(gl, list) or len(gl) != len(wl):
            n = len(gl) if isinstance(gl, list) else "none"
            raise PackModelMismatch(f"layer count expected {len(wl)}, got {n}")
        for i, (w, g) in enumerate(zip(wl, gl)):
            for j, field in enumerate(_LAYER_FIELDS):
                wv = w[j] if j < len(w) else None
                gv = g[j] if isinstance(g, list) and j < len(g) else None
                if wv != gv:
                    raise PackModelMismatch(f"{field} of layer {i} expected {wv}, got {gv}")
            if w != g:
                raise PackModelMismatch(f"layer {i} expected {w}, got {g}")
    for key in sorted(set(want) & set(got)):
        if want[key] != got[key]:
            raise PackModelMismatch(f"{key} expected {_short(want[key])!r:.80}, got {_short(got[key])!r:.80}")


# ---------------------------------------------------------------------------- keys
def load_key(key_file=None, env=None) -> bytes | None:
    """The pack key: the bytes of `key_file` (one trailing newline dropped), else the
    MUSER_PACK_KEY environment variable (UTF-8), else None (integrity only)."""
    if key_file is not None:
        with open(key_file, "rb") as f:
            key = f.read()
        key = key[:-2] if key.endswith(b"\r\n") else key[:-1] if key.endswith(b"\n") else key
        return _as_key(key)
    value = (os.environ if env is None else env).get(KEY_ENV)
    return _as_key(value) if value else None
