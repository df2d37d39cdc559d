"""Check a device plan's commands in one process (device_plan.sh DRY=1 calls this at its end).

    python3 benchmarks/dry_check.py LIST

LIST holds one command a line, fields split by \\x1f: `bench SCRIPT ARGS...` (the script's
argparse must accept the arguments: args_check.py's test, here in-process) or `tests
PYTEST-ARGS...` (the selection must collect at least one test).  Why one process: one
interpreter a command paid torch's import ~77 times -- 222 s of the CI suite
(`tests/test_device_plan.py`) for checks that take seconds once the imports are warm.
Exits 1 at the first command that fails, after printing why.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

from args_check import check


class _Count:
    """A pytest plugin that keeps the number of items a collection selected."""

    def __init__(self):
        self.n = 0

    def pytest_collection_finish(self, session):
        self.n = len(session.items)


def selected(args: list[str]) -> tuple[int, str]:
    """(how many tests `pytest ARGS` selects -- collection only --, what pytest printed)."""
    count, said = _Count(), io.StringIO()
    with contextlib.redirect_stdout(said):
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *args], plugins=[count])
    return count.n, said.getvalue()


def main() -> int:
    sys.path.insert(0, str(Path.cwd()))     # as `python3 -m pytest` from the repository root
    lines = Path(sys.argv[1]).read_text().splitlines()
    for line in dict.fromkeys(lines):       # a command several stages share: checked once
        kind, *args = line.split("\x1f")
        print(f"+ {kind} {' '.join(args)}")
        if kind == "bench":
            ok, said = check(args[0], args[1:])
            print(f"  {args[0]}: {said}")
            if not ok:
                return 1
        else:
            n, said = selected(args)
            print(f"  {n} tests selected")
            if n == 0:
                print(said[-2000:])
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
