"""Every tensor-core dot of the step's kernels sums its k in one order -- checked in the code
Triton compiles for sm_90, here, without a GPU (benchmarks/sm90_ptx.py's configurations).

Why: an MMA adds its 16 products in a fixed internal order, so rows agree bit for bit across
tiles (decode == verify == prefill rows, bf16 == int8-head) only if every tile hands each MMA the
same k in the same lanes.  Triton chooses a dot operand's register layout from the narrowest
type it can trace the operand back to: from an 8-bit load it takes four k a lane (TTGIR
`kWidth = 4`), permuting k inside each m16n8k16 MMA; from 16-bit values two (`kWidth = 2`);
wgmma tiles read the weights from shared memory (no kWidth on them).  Two int8 tiles took 4
until the thirty-seventh session (`_layout_fence`, backends/cuda/triton_dot_loads.py) and
rounded about one output in 10^4 apart on the H200.  A new kernel whose dot takes another
layout fails here before it reaches a GPU.  One tile takes 4 on purpose: quant="int8-head-fast"'s
head (its speed), which every head row of that mode goes through and no other row reaches.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudautil import triton_available

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = """
import json, sys
sys.path.insert(0, "benchmarks")
import sm90_ptx
print(json.dumps(sm90_ptx.mma_layouts()))
"""


@pytest.mark.skipif(not triton_available(), reason="needs Triton (the test extra installs it)")
def test_every_dot_in_the_step_kernels_takes_the_one_mma_layout_on_sm90():
    # a process of its own: this one may run Triton's interpreter, which compiles nothing
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", LAYOUTS], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    layouts = json.loads(done.stdout.strip().splitlines()[-1])
    # the one tile allowed its own order: quant="int8-head-fast"'s head, which no row reaches
    # through any other tile (tests/cuda/test_int8_step.py -k sends_every_row); its layout is
    # the reason the mode is fast, so it is pinned too
    own = {name: kw for name, kw in layouts.items() if name.endswith("(int8-head-fast)")}
    assert len(own) == 2 and all(kw == ["kWidth = 4"] for kw in own.values()), own
    odd = {name: kw for name, kw in layouts.items()
           if kw not in ([], ["kWidth = 2"]) and name not in own}
    assert not odd, odd
    for name in ("dot_rows head, 16-row tile, picking, block int8",      # the two int8 tiles
                 "dot_rows qkv 16-row decode tile, int8 rows", "decode ring fused"):
        assert layouts[name] == ["kWidth = 2"], (name, layouts[name])
