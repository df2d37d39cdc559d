"""The disk tier: every block and cut is one session pack in `<dir>/<namespace>/`.

Owns: file names, writing an object as a pack (atomic, durable, HMAC-sealed with the pack key
when one is given), the startup scan that rebuilds what survived a restart, loading an object
back with every check, and refusing a bad file (`StoreCorrupt`: the caller logs, counts and
removes it).  Does not own: deciding what to write or evict (store.py, index.py).

Files (a pack each, `docs/pack-format.md`; `muser pack verify` accepts them):
    b-<chain hex>-<content digest, 32 hex>.pack
        a block: one plane per prefix (growing) plane, rows [iB, (i+1)B), position (i+1)B
    c-<cut key hex>.pack
        a cut: every plane's own rows (ring windows; growing rows past the last whole block)
Both carry the pack's sealed `meta` object, {"store": record}, whose record binds them to the chain:
    "store": {"kind": "block", "namespace", "block_size", "chain", "parent", "index", "ids"}
    "store": {"kind": "cut", "namespace", "block_size", "key", "base", "tail",
              "blocks": [[chain hex, digest], ...]}
and the pack's own model fingerprint and encoding, checked against the engine on every read: a
file of another model or encoding is refused, never installed.  On a scan a block must hash to
its name (chain = SHA-256(parent || ids), digest from the manifest's tensor digests); a cut must
stand on a gapless chain of present blocks from the namespace root to its base.  Tensor digests
are verified when an object is loaded.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from ..cache.snapshot import PlaneCut, SessionSnapshot
from ..errors import MuserError, StoreCorrupt
from ..pack.format import pid_alive, save_pack
from ..pack.reader import load_with_manifest, read_manifest
from ..pack.manifest import check_model
from . import chain as ch
from .objects import Block, Cut, Layout

log = logging.getLogger("muser.store")
BLOCK_NAME = re.compile(r"b-([0-9a-f]{64})-([0-9a-f]{32})\.pack\Z")
CUT_NAME = re.compile(r"c-([0-9a-f]{64})\.pack\Z")
TEMP_NAME = re.compile(r"\..+\.(\d+)\.[^.]+\.tmp\Z")


@dataclass
class Scanned:
    """What a restart found: records ready for the index, and how many files were refused."""

    cuts: list            # (Cut, file bytes, mtime)
    refused: int


class DiskTier:
    def __init__(self, root_dir, namespace: str, layout: Layout, block_size: int, key: bytes | None):
        self.namespace, self.layout, self.block_size, self.key = namespace, layout, block_size, key
        self.dir = Path(root_dir) / namespace[:32]
        self.dir.mkdir(parents=True, exist_ok=True)
        self.root = ch.root(namespace)

    # ------------------------------------------------------------------ names
    def path(self, obj) -> Path:
        if isinstance(obj, Block):
            return self.dir / f"b-{obj.chain.hex()}-{obj.digest[:32]}.pack"
        return self.dir / f"c-{obj.key.hex()}.pack"

    def remove(self, obj) -> None:
        try:
            self.path(obj).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:                          # a read-only disk: the index forgets it anyway
            log.warning("cut store: could not remove %s: %s", self.path(obj).name, e)

    # ------------------------------------------------------------------ writing (writer thread)
    def _store_field(self, obj) -> dict:
        common = {"namespace": self.namespace, "block_size": self.block_size}
        if isinstance(obj, Block):
            return {"kind": "block", "chain": obj.chain.hex(), "parent": obj.parent.hex(),
                    "index": obj.index, "ids": list(obj.ids), **common}
        return {"kind": "cut", "key": obj.key.hex(), "base": obj.base.hex(), "tail": list(obj.tail),
                "blocks": [[b.chain.hex(), b.digest] for b in obj.blocks], **common}

    def _snapshot(self, position: int, planes) -> SessionSnapshot:
        return SessionSnapshot(position, self.layout.encoding, tuple(planes), (), dict(self.layout.fingerprint))

    def write_block(self, b: Block, rows) -> tuple[str, int]:
        """Write block `b` (rows: its PlaneCuts); returns (content digest, file bytes)."""
        digest = b.digest or ch.content_digest([t for c in rows for t in (c.keys, c.values)])
        b.digest = digest
        path = self.path(b)
        save_pack(self._snapshot((b.index + 1) * self.block_size, rows), path, key=self.key,
                  meta={"store": self._store_field(b)})
        return digest, path.stat().st_size

    def write_cut(self, cut: Cut, payload) -> int:
        path = self.path(cut)
        save_pack(self._snapshot(cut.position, payload), path, key=self.key,
                  meta={"store": self._store_field(cut)})
        return path.stat().st_size

    # ------------------------------------------------------------------ checks
    def _gate(self, path: Path, manifest: dict, kind: str) -> dict:
        """Fields every store file must have right before anything else of it is trusted."""
        rec = (manifest.get("meta") or {}).get("store")
        if not isinstance(rec, dict) or rec.get("kind") != kind:
            raise StoreCorrupt(path, f"expected a {kind} record in the manifest, found {str(rec)[:80]}")
        if rec.get("namespace") != self.namespace or rec.get("block_size") != self.block_size:
            raise StoreCorrupt(path, "namespace or block size of another model, encoding or layout")
        try:
            check_model(manifest.get("model") or {}, self.layout.fingerprint)
        except MuserError as e:
            raise StoreCorrupt(path, f"foreign model: {e}") from None
        enc = manifest.get("encoding") or {}
        if (enc.get("family"), enc.get("dtype")) != (self.layout.encoding.family, self.layout.encoding.dtype):
            raise StoreCorrupt(path, f"encoding expected {self.layout.encoding}, found {enc}")
        return rec

    def _check_planes(self, path: Path, planes, position: int, start_of_prefix: int, only_prefix: bool):
        """Plane list of a block (prefix planes only) or a cut (every plane) against the layout."""
        want = [p for p in self.layout.planes if p.kind == "growing" or not only_prefix]
        got = [(p["layer"], p["kind"], p["window"], p["start"], p["count"], tuple(p["shape"][1:]))
               for p in planes]
        exp = []
        for p in want:
            count = position - start_of_prefix if p.kind == "growing" else min(position, p.capacity)
            exp.append((p.layer, p.kind, p.window, position - count, count,
                        (self.layout.kv_heads, self.layout.head_dim)))
        if got != exp:
            raise StoreCorrupt(path, f"planes expected {exp[:2]}..., found {got[:2]}...")

    def _check_block(self, path: Path, m: dict) -> tuple[bytes, str, dict]:
        rec = self._gate(path, m, "block")
        match = BLOCK_NAME.fullmatch(path.name)
        ids, index = rec.get("ids"), rec.get("index")
        if not (isinstance(ids, list) and len(ids) == self.block_size and isinstance(index, int)):
            raise StoreCorrupt(path, f"block record expected {self.block_size} ids and an index")
        chain = ch.link(bytes.fromhex(rec["parent"]), ids)
        if match is None or chain.hex() != rec["chain"] or match.group(1) != rec["chain"]:
            raise StoreCorrupt(path, "chain expected SHA-256(parent || ids) == the file's name")
        digest = ch.digest_of_shas([p[w]["sha256"] for p in m["planes"] for w in ("keys", "values")])
        if digest[:32] != match.group(2):
            raise StoreCorrupt(path, f"content digest expected {match.group(2)}, found {digest[:32]}")
        self._check_planes(path, m["planes"], (index + 1) * self.block_size, index * self.block_size, True)
        return chain, digest, rec

    # ------------------------------------------------------------------ startup scan
    def scan(self, refuse) -> Scanned:
        """Rebuild the tier from its files.  `refuse(path, error)` is called for every bad file
        (the caller logs, counts and removes it); stale temporaries of dead writers go too."""
        blocks: dict[tuple[bytes, str], tuple[Block, int]] = {}
        cut_files, refused = [], 0
        for path in sorted(self.dir.iterdir()):
            name = path.name
            temp = TEMP_NAME.fullmatch(name)
            if temp is not None:
                if not pid_alive(int(temp.group(1))):
                    path.unlink(missing_ok=True)
                continue
            if not name.endswith(".pack"):
                continue
            try:
                m = read_manifest(path, key=self.key)["manifest"]
                if name.startswith("b-"):
                    chain, digest, rec = self._check_block(path, m)
                    nbytes = sum(p[w]["length"] for p in m["planes"] for w in ("keys", "values"))
                    b = Block(chain, bytes.fromhex(rec["parent"]), rec["index"], tuple(rec["ids"]),
                              nbytes, digest=digest)
                    blocks[(chain, digest)] = (b, path.stat().st_size)
                elif name.startswith("c-"):
                    cut_files.append((path, m))
                else:
                    raise StoreCorrupt(path, "expected a b-*.pack or c-*.pack name")
            except (MuserError, OSError, ValueError, KeyError, TypeError) as e:
                refused += 1
                refuse(path, e)
        used: set = set()
        cuts = []
        for path, m in cut_files:
            try:
                cut = self._cut_from(path, m, blocks)
            except (MuserError, ValueError, KeyError, TypeError) as e:
                refused += 1
                refuse(path, e)
                continue
            used |= {id(b) for b in cut.blocks}
            cuts.append((cut, path.stat().st_size, path.stat().st_mtime_ns,
                         {id(b): size for b, size in blocks.values()}))
        for b, _ in blocks.values():
            if id(b) not in used:                      # no cut stands on it: garbage
                (self.dir / f"b-{b.chain.hex()}-{b.digest[:32]}.pack").unlink(missing_ok=True)
        return Scanned(cuts, refused)

    def _cut_from(self, path: Path, m: dict, blocks) -> Cut:
        rec = self._gate(path, m, "cut")
        match = CUT_NAME.fullmatch(path.name)
        tail, refs = rec.get("tail"), rec.get("blocks")
        if not (isinstance(tail, list) and isinstance(refs, list) and len(tail) < self.block_size):
            raise StoreCorrupt(path, "cut record expected a tail shorter than a block and a block list")
        chain, got = self.root, []
        for j, ref in enumerate(refs):
            entry = blocks.get((bytes.fromhex(ref[0]), ref[1])) if isinstance(ref, list) and len(ref) == 2 else None
            if entry is None:
                raise StoreCorrupt(path, f"block {j} of the cut is missing or was refused")
            b = entry[0]
            if b.parent != chain or b.index != j:
                raise StoreCorrupt(path, f"block {j} expected to follow the chain, found a gap")
            chain = b.chain
            got.append(b)
        key = ch.cut_key(chain, tail)
        position = len(refs) * self.block_size + len(tail)
        if match is None or key.hex() != rec.get("key") or match.group(1) != rec["key"] \
                or rec.get("base") != chain.hex() or m["position"] != position:
            raise StoreCorrupt(path, "cut key expected SHA-256(base chain || tail) == the file's name")
        self._check_planes(path, m["planes"], position, len(refs) * self.block_size, False)
        nbytes = sum(p[w]["length"] for p in m["planes"] for w in ("keys", "values"))
        return Cut(key, chain, position, tuple(tail), tuple(got), nbytes)

    # ------------------------------------------------------------------ loading (full checks)
    def _load(self, obj, kind: str) -> tuple[PlaneCut, ...]:
        path = self.path(obj)
        try:
            snap, m = load_with_manifest(path, key=self.key, expect_model=self.layout.fingerprint,
                                         expect_encoding=self.layout.encoding)
        except FileNotFoundError:
            raise StoreCorrupt(path, "the file is gone") from None
        except (MuserError, OSError) as e:
            raise StoreCorrupt(path, str(e)) from None
        rec = self._gate(path, m, kind)
        if rec != self._store_field(obj):
            raise StoreCorrupt(path, "store record differs from the one indexed at startup")
        if kind == "block":
            self._check_planes(path, m["planes"], (obj.index + 1) * self.block_size,
                               obj.index * self.block_size, True)
        else:
            self._check_planes(path, m["planes"], obj.position, len(obj.blocks) * self.block_size, False)
        return snap.planes

    def load_block(self, b: Block) -> tuple[PlaneCut, ...]:
        return self._load(b, "block")

    def load_cut(self, cut: Cut) -> tuple[PlaneCut, ...]:
        return self._load(cut, "cut")
