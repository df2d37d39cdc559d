"""muser/env.py: every MUSER_* knob typed, read in one place, documented in one table."""
import re
from pathlib import Path

import pytest

from muser import env, knobs
from muser.errors import EnvError

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_without_any_knob():
    e = env.read({})
    assert e == env.Env()
    assert e.native and e.rows == "fused" and e.gemv == "dot" and e.attn == "fused"
    assert e.pack_key is None and e.api_key is None and e.attn_ring is None
    assert e.native_dir == Path("~/.cache/muser/native").expanduser()
    assert e.reference_dir == Path("~/.cache/muser/test-reference").expanduser()


@pytest.mark.parametrize("name, value, field, want", [
    ("MUSER_CACHE_DIR", "/tmp/mc", "cache_dir", Path("/tmp/mc")),
    ("MUSER_NATIVE", "0", "native", False),
    ("MUSER_NATIVE", "off", "native", False),
    ("MUSER_NATIVE", "1", "native", True),
    ("MUSER_PACK_KEY", "s3cret", "pack_key", "s3cret"),
    ("MUSER_API_KEY", "k", "api_key", "k"),
    ("MUSER_ROWS", "eager", "rows", "eager"),
    ("MUSER_GEMV", "fast", "gemv", "fast"),
    ("MUSER_GEMV", "none", "gemv", "none"),
    ("MUSER_ATTN", "separate", "attn", "separate"),
    ("MUSER_RING_ROWS", "64", "ring_rows", 64),
    ("MUSER_GROWING_ROWS", "128", "growing_rows", 128),
    ("MUSER_CHUNKS", "fast", "chunks", "fast"),
    ("MUSER_RING_GROUP", "8", "ring_group", 8),
    ("MUSER_MERGE_LOADS", "4", "merge_loads", "4"),
    ("MUSER_CHUNK_LOOP", "flat", "chunk_loop", "flat"),
    ("MUSER_CHUNK_COLUMNS", "2", "chunk_columns", "2"),
    ("MUSER_GROWING_GROUP", "8", "growing_group", 8),
    ("MUSER_ATTN_RING", "64,8", "attn_ring", (64, 8)),
    ("MUSER_ATTN_GROWING", "32x8", "attn_growing", (32, 8)),
    ("MUSER_ATTN_GROWING", "16,4", "attn_growing", (16, 4)),
    ("MUSER_TEST_REF_DIR", "/tmp/ref", "test_ref_dir", Path("/tmp/ref")),
    ("MUSER_TEST_REFRESH", "1", "test_refresh", True),
    ("MUSER_TRITON_INTERPRET", "yes", "triton_interpret", True),
    ("MUSER_ROWS", "", "rows", "fused"),              # empty == unset
    ("MUSER_PACK_KEY", "", "pack_key", ""),           # ... but a key is kept as set: blank is refusable
    ("MUSER_API_KEY", " ", "api_key", " "),
])
def test_each_knob_is_typed(name, value, field, want):
    assert getattr(env.read({name: value}), field) == want


@pytest.mark.parametrize("name, value", [
    ("MUSER_NATIVE", "maybe"), ("MUSER_ROWS", "fast"), ("MUSER_GEMV", "all"), ("MUSER_ATTN", "x"),
    ("MUSER_RING_ROWS", "0"), ("MUSER_RING_ROWS", "3.5"), ("MUSER_GROWING_ROWS", "-1"), ("MUSER_CHUNKS", "quick"),
    ("MUSER_ATTN_RING", "64"), ("MUSER_ATTN_GROWING", "a,b"), ("MUSER_ATTN_RING", "0,4"),
    ("MUSER_ATTN_RING", "32x4x2"), ("MUSER_ATTN_RING", "32x,4"),
    ("MUSER_TEST_REFRESH", "2"),
])
def test_a_bad_value_is_refused_naming_the_variable(name, value):
    with pytest.raises(EnvError, match=rf"{name} expected .*, got {re.escape(repr(value))}"):
        env.read({name: value})


def test_the_old_cache_variable_is_refused_not_ignored():
    with pytest.raises(EnvError, match="MUSER_CACHE expected nothing \\(renamed to MUSER_CACHE_DIR\\)"):
        env.read({"MUSER_CACHE": "/tmp/x"})


@pytest.mark.parametrize("name, old", [(n, knobs.REMOVED_DEFAULT.get(n, "off"))
                                       for n in knobs.REMOVED])
def test_a_removed_switch_is_refused_unless_off_or_its_old_default(name, old):
    for on in ("on", "early", "last", "128", "16", "halves"):
        with pytest.raises(EnvError, match=rf"{name} expected nothing \(removed: measured "):
            env.read({name: on})
    for off in ("off", "0", "false", old):
        assert env.read({name: off}) == env.read({})


def test_the_documented_table_is_the_knob_table():
    doc = (ROOT / "docs" / "env.md").read_text()
    assert knobs.table() in doc, "docs/env.md is out of date: paste muser.knobs.table()"


def _python_files():
    for folder in ("muser", "tests", "benchmarks"):
        yield from (ROOT / folder).rglob("*.py")


def test_every_knob_the_code_names_is_in_the_table():
    named = set()
    for f in _python_files():
        named |= set(re.findall(r"\bMUSER_[A-Z_]+\b", f.read_text()))
    named -= {"MUSER_MODES", "MUSER_UNWRITABLE_TEST"}     # a benchmark constant, a C define
    assert named <= set(knobs.KNOBS) | set(knobs.RENAMED) | set(knobs.REMOVED), \
        sorted(named - set(knobs.KNOBS))


def test_nothing_but_env_py_reads_a_muser_variable():
    pattern = re.compile(r"environ(\.get)?[\[(]\s*['\"]MUSER_|getenv\(\s*['\"]MUSER_")
    readers = [str(f.relative_to(ROOT)) for f in (ROOT / "muser").rglob("*.py")
               if f.name != "env.py" and pattern.search(f.read_text())]
    assert readers == []
