"""benchmarks/device_plan.sh, dry (benchmarks/dry_check.py): every stage's benchmark flags parse and every pytest
selection selects something -- on this machine, before a device call spends minutes of set-up
on a command that cannot run (the ninth session lost a llama.cpp run to a flag cuda_bench.py
does not have)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "benchmarks" / "device_plan.sh"


def stages():
    return re.findall(r"^stage_(\w+)\(\)", PLAN.read_text(), flags=re.M)


def dry(out, *names):
    env = {**os.environ, "DRY": "1", "OUT": str(out)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"    # this python3
    return subprocess.run(["bash", str(PLAN), *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def test_every_stage_of_the_device_plan_checks_out_dry(tmp_path):
    names = stages()
    assert {"many", "chunk_first", "llama"} <= set(names)
    r = dry(tmp_path, *names)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("arguments accepted") >= 2 and "tests selected" in r.stdout


def test_an_unknown_stage_is_refused(tmp_path):
    r = dry(tmp_path, "no_such_stage")
    assert r.returncode == 2 and "no stage 'no_such_stage'" in r.stdout


def test_a_bad_flag_or_an_empty_selection_fails_the_dry_check(tmp_path):
    cases = [("bench", "benchmarks/cuda_bench.py", "--no-such-flag"),
             ("tests", "tests/test_device_plan.py", "-k", "no_test_is_named_so")]
    for case in cases:
        listed = tmp_path / "dry.list"
        listed.write_text("\x1f".join(case) + "\n")
        r = subprocess.run([sys.executable, "benchmarks/dry_check.py", str(listed)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, (case, r.stdout[-2000:], r.stderr[-2000:])
