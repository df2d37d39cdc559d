"""Check a benchmark's command line on this machine, without running it (device_plan.sh DRY=1).

    python3 benchmarks/args_check.py benchmarks/cuda_bench.py --models 1b --quick

A script with argparse: its parser must accept the arguments (a wrong flag exits 2 with the
usage, as it would on the device after minutes of set-up).  A script without one takes
positional arguments only: it is not run (it would start on the GPU).
"""
import argparse
import runpy
import sys
from pathlib import Path


class Parsed(Exception):
    pass


def main():
    script, args = sys.argv[1], sys.argv[2:]
    if "argparse" not in Path(script).read_text():
        print(f"  {script}: positional arguments {args} (not checked)")
        return
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, argv=None, namespace=None):
        real(self, argv, namespace)                   # a bad flag: usage and exit 2, here
        raise Parsed

    argparse.ArgumentParser.parse_args = parse_only
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except Parsed:
        print(f"  {script}: arguments accepted")
        return
    sys.exit(f"  {script}: finished without parsing its arguments")


if __name__ == "__main__":
    main()
