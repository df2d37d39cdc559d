"""Every MUSER_* environment variable, typed and read in one place.

Owns: `Env` (the parsed values, frozen) and `read(environ)`, which parses every knob at
once and refuses a bad value with an `EnvError` naming the variable, what it accepts and what
it found.  The knobs themselves (name, type, default, who reads it, what it does; the renamed
and removed ones) are data in muser/knobs.py, which docs/env.md is checked against.
Does not own: deciding anything from the values.  Callers read the
environment once per entry point (`muser.load` / an `Engine`, a CLI command,
the native-kernel loader) and pass the `Env` on; nothing below that reads
`os.environ`.

An empty variable counts as unset -- except the two keys (MUSER_PACK_KEY,
MUSER_API_KEY), which keep exactly what was set, so that a command can refuse
a blank key (`muser serve` does) instead of mistaking it for no key.  A renamed
variable still set is refused rather than silently ignored (`knobs.RENAMED`), and so is a
removed experiment switch set to anything but off or its old default (`knobs.REMOVED`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import EnvError
from .knobs import KNOBS, REMOVED, REMOVED_DEFAULT, RENAMED

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Env:
    cache_dir: Path = Path("~/.cache/muser").expanduser()
    native: bool = True
    pack_key: str | None = None                     # as set (may be blank); None: unset
    api_key: str | None = None                      # as set (may be blank); None: unset
    rows: str = "fused"
    gemv: str = "dot"
    attn: str = "fused"
    chunks: str = "exact"
    ring_rows: int = 32
    growing_rows: int = 128
    ring_group: int = 4
    merge_loads: str = "4"
    chunk_loop: str = "auto"
    chunk_columns: str = "1"
    attn_tiles: str = "interior"
    chunk_first: str = "on"
    chunk_align: str = "on"
    chunk_order: str = "heavy"
    chunk_wide: str = "on"
    chunk_fence: str = "on"
    chunk_whole: str = "on"
    chunk_base: str = "on"
    chunk_park: str = "16"
    chunk_prep: str = "alone"
    flatten: str = "dot"
    dot_tma: str = "auto"
    dot_cpp: str = "off"
    fuse_sum: str = "on"
    chunk_graphs: str = "on"
    chunk_graph_rows: int | None = None             # None: auto (chunk_graph.auto_limit)
    graph_keys: str = "staged"
    pdl: str = "on"
    pipeline: str = "on"
    attn_regs: str = "auto"
    prefetch: str = "auto"
    attn_early: str = "on"
    attn_acc: str = "dot"
    growing_group: int = 16
    attn_ring: tuple[int, int] | None = None        # (block_n, warps)
    attn_growing: tuple[int, int] | None = None
    test_ref_dir: Path | None = None
    test_refresh: bool = False
    triton_interpret: bool = False

    @property
    def native_dir(self) -> Path:
        return self.cache_dir / "native"

    @property
    def digests_path(self) -> Path:
        return self.cache_dir / "digests.json"

    @property
    def reference_dir(self) -> Path:
        return self.test_ref_dir or self.cache_dir / "test-reference"


def _bad(name: str, found: str) -> EnvError:
    return EnvError(name, KNOBS[name][0], found)


def _bool(name: str, v: str) -> bool:
    low = v.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise _bad(name, v)


def _choice(name: str, v: str) -> str:
    if v not in KNOBS[name][0].split("|"):
        raise _bad(name, v)
    return v


def _count(name: str, v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise _bad(name, v) from None
    if n < 1:
        raise _bad(name, v)
    return n


def _tile(name: str, v: str) -> tuple[int, int]:
    """"block_n,warps" -- or "block_nxwarps" (32x8), which a list of NAME=VALUE,NAME=VALUE
    assignments (benchmarks/exact_ab.py --variants) can carry."""
    parts = v.split("x") if "x" in v else v.split(",")
    if len(parts) != 2:
        raise _bad(name, v)
    try:
        bn, warps = int(parts[0]), int(parts[1])
    except ValueError:
        raise _bad(name, v) from None
    if bn < 1 or warps < 1:
        raise _bad(name, v)
    return bn, warps


def read(environ: Mapping[str, str] | None = None) -> Env:
    """Parse every MUSER_* knob of `environ` (default: the process environment)."""
    e = os.environ if environ is None else environ
    for old, new in RENAMED.items():
        if e.get(old):
            raise EnvError(old, f"nothing (renamed to {new})", e[old])
    for old, why in REMOVED.items():
        if e.get(old) and e[old].strip().lower() not in (*_FALSE, REMOVED_DEFAULT.get(old)):
            raise EnvError(old, f"nothing ({why})", e[old])

    def get(name: str) -> str | None:
        v = e.get(name)
        return v if v else None

    kw: dict = {}
    if (v := get("MUSER_CACHE_DIR")) is not None:
        kw["cache_dir"] = Path(v).expanduser()
    if (v := get("MUSER_NATIVE")) is not None:
        kw["native"] = _bool("MUSER_NATIVE", v)
    kw["pack_key"] = e.get("MUSER_PACK_KEY")       # a blank key is the reader's to refuse
    kw["api_key"] = e.get("MUSER_API_KEY")
    for name, field in (("MUSER_ROWS", "rows"), ("MUSER_GEMV", "gemv"), ("MUSER_ATTN", "attn"),
                        ("MUSER_CHUNKS", "chunks"), ("MUSER_MERGE_LOADS", "merge_loads"),
                        ("MUSER_CHUNK_LOOP", "chunk_loop"), ("MUSER_CHUNK_COLUMNS", "chunk_columns"),
                        ("MUSER_ATTN_TILES", "attn_tiles"), ("MUSER_ATTN_ACC", "attn_acc"),
                        ("MUSER_CHUNK_GRAPHS", "chunk_graphs"), ("MUSER_PDL", "pdl"),
                        ("MUSER_GRAPH_KEYS", "graph_keys"),
                        ("MUSER_CHUNK_FIRST", "chunk_first"), ("MUSER_CHUNK_PARK", "chunk_park"),
                        ("MUSER_CHUNK_PREP", "chunk_prep"), ("MUSER_FLATTEN", "flatten"),
                        ("MUSER_FUSE_SUM", "fuse_sum"), ("MUSER_PIPELINE", "pipeline"),
                        ("MUSER_ATTN_REGS", "attn_regs"),
                        ("MUSER_PREFETCH", "prefetch"),
                        ("MUSER_ATTN_EARLY", "attn_early"),
                        ("MUSER_DOT_TMA", "dot_tma"), ("MUSER_DOT_CPP", "dot_cpp"),
                        ("MUSER_CHUNK_ALIGN", "chunk_align"), ("MUSER_CHUNK_ORDER", "chunk_order"),
                        ("MUSER_CHUNK_WIDE", "chunk_wide"), ("MUSER_CHUNK_FENCE", "chunk_fence"),
                        ("MUSER_CHUNK_WHOLE", "chunk_whole"), ("MUSER_CHUNK_BASE", "chunk_base")):
        if (v := get(name)) is not None:
            kw[field] = _choice(name, v)
    for name, field in (("MUSER_RING_ROWS", "ring_rows"), ("MUSER_GROWING_ROWS", "growing_rows"),
                        ("MUSER_RING_GROUP", "ring_group"), ("MUSER_GROWING_GROUP", "growing_group")):
        if (v := get(name)) is not None:
            kw[field] = _count(name, v)
    if (v := get("MUSER_CHUNK_GRAPH_ROWS")) is not None and v != "auto":
        kw["chunk_graph_rows"] = _count("MUSER_CHUNK_GRAPH_ROWS", v)
    for name, field in (("MUSER_ATTN_RING", "attn_ring"), ("MUSER_ATTN_GROWING", "attn_growing")):
        if (v := get(name)) is not None:
            kw[field] = _tile(name, v)
    if (v := get("MUSER_TEST_REF_DIR")) is not None:
        kw["test_ref_dir"] = Path(v).expanduser()
    for name, field in (("MUSER_TEST_REFRESH", "test_refresh"), ("MUSER_TRITON_INTERPRET", "triton_interpret")):
        if (v := get(name)) is not None:
            kw[field] = _bool(name, v)
    return Env(**kw)
