"""Every name a benchmark script reads is bound somewhere in it (an import, an assignment, a
def, a parameter) or is a builtin -- checked here, because most of benchmarks/ only runs on the
device, where a NameError costs a device call (the ninth session's `ttft_512` row: `muser_ttft`
was called and never imported).  A coarse check, by design: a name bound anywhere in the file
counts as bound everywhere, so it finds missing imports and typos, not scoping bugs."""
import ast
import builtins
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def unbound_names(source: str) -> set[str]:
    tree = ast.parse(source)
    bound = set(dir(builtins)) | {"__file__", "__name__", "__doc__"}
    loaded = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loaded.setdefault(node.id, node.lineno)
            else:
                bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return {f"{n} (line {line})" for n, line in loaded.items() if n not in bound}


def test_the_check_finds_a_name_never_bound():
    assert unbound_names("import os\ndef f(a):\n    return muser_ttft(a, os)\n") == \
        {"muser_ttft (line 3)"}
    assert unbound_names("from x import muser_ttft\ndef f(a):\n    return muser_ttft(a)\n") == set()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_name_a_benchmark_reads_is_bound(script):
    assert SCRIPTS, "no benchmark scripts found"
    assert unbound_names(script.read_text()) == set()
