"""One-way imports, checked on the source: cache/ imports no model, engine, backend, pack or
server; no package imports the CLI; nothing papers over a missing sibling module."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "muser"


def imports(f: Path) -> set[str]:
    """Absolute muser module names a file imports (relative imports resolved)."""
    pkg = f.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    out = set()
    for m in re.finditer(r"^\s*from (\.+)([\w.]*) import|^\s*(?:from|import) (muser[\w.]*)", f.read_text(), re.M):
        if m.group(3):
            out.add(m.group(3))
        else:
            base = pkg[:len(pkg) - (len(m.group(1)) - 1)]
            out.add(".".join((*base, *filter(None, [m.group(2)]))))
    return out


def files(sub: str = ""):
    return sorted((ROOT / sub).rglob("*.py"))


def test_cache_imports_storage_only():
    bad = {f.name: sorted(i for i in imports(f) if re.match(r"muser\.(model|engine|backends|pack|server|cli)", i))
           for f in files("cache")}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_package_imports_the_cli():
    users = [str(f.relative_to(ROOT)) for f in files() if "cli" not in f.relative_to(ROOT).parts[:1]
             and any(i == "muser.cli" or i.startswith("muser.cli.") for i in imports(f))]
    assert users == []


def test_no_fallback_around_a_sibling_module():
    """`except ImportError` only where a third-party package is optional (Triton)."""
    hits = [f"{f.relative_to(ROOT)}" for f in files() if "except ImportError" in f.read_text()]
    assert hits == ["backends/cuda/triton_rows.py"]
