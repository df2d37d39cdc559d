"""The static SASS of a kernel's hottest loop, by opcode: a free predictor for issue-bound code.

An issue-bound kernel's time follows the instructions its main loop issues a trip.  This takes
a PTX file (`sm90_ptx.py --out DIR` writes them), assembles it with the Triton wheel's ptxas
for sm_90a, disassembles it (nvdisasm) and finds the loops: each backward branch `BRA` to an
earlier address closes a loop [target, branch].  It prints the largest loops by instruction
count and, for the one asked (default: the largest), the opcode histogram -- compare two trees'
PTX (before / after a change) before spending device time (benchmarks/NOTES.md, thirtieth and
thirty-first sessions).

    PYTHONPATH=/tmp/t36 python3 benchmarks/sass_loop.py DIR/kernel.ptx [--loop N] [--top 25]
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def tools() -> Path:
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def sass(ptx: Path) -> list[tuple[int, str, str]]:
    """(address, opcode with modifiers, operands) of every instruction."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        subprocess.run([str(tools() / "ptxas"), "-arch=sm_90a", "-o", str(cubin), str(ptx)],
                       check=True, capture_output=True)
        text = subprocess.run([str(tools() / "nvdisasm"), "-c", str(cubin)], check=True,
                              capture_output=True, text=True).stdout
    out, labels, pending = [], {}, []
    for line in text.splitlines():
        lab = re.match(r"\s*(\.L_x_\d+):", line)
        if lab:
            pending.append(lab.group(1))
            continue
        m = LINE.search(line)
        if m:
            addr = int(m.group(1), 16)
            labels.update((name, addr) for name in pending)
            pending = []
            out.append((addr, m.group(3), m.group(4)))
    # branch targets by address (nvdisasm prints them as labels)
    return [(a, op, re.sub(r"(\.L_x_\d+)", lambda t: f"{labels.get(t.group(1), -1):#x}", args))
            for a, op, args in out]


def loops(ins: list[tuple[int, str, str]]) -> list[tuple[int, int, int]]:
    """(instructions, start, end) of every backward branch's loop, largest first."""
    out = []
    for addr, op, args in ins:
        t = re.search(r"0x([0-9a-f]+)", args)
        if op.startswith("BRA") and t and int(t.group(1), 16) < addr:
            lo = int(t.group(1), 16)
            out.append((sum(1 for a, _, _ in ins if lo <= a <= addr), lo, addr))
    return sorted(out, reverse=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("ptx", type=Path)
    ap.add_argument("--loop", type=int, default=0, help="which loop, largest first")
    ap.add_argument("--top", type=int, default=25, help="opcodes shown")
    a = ap.parse_args()
    ins = sass(a.ptx)
    found = loops(ins)
    print(f"{a.ptx.name}: {len(ins)} instructions; loops (size, start, end):")
    for n, lo, hi in found[:6]:
        print(f"  {n:6d}  {lo:#x}..{hi:#x}")
    n, lo, hi = found[a.loop]
    ops = collections.Counter(op.split(".")[0] for ad, op, _ in ins if lo <= ad <= hi)
    print(f"loop {a.loop}: {n} instructions")
    for op, c in ops.most_common(a.top):
        print(f"  {op:10s} {c:5d}")


if __name__ == "__main__":
    main()
