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


def check(script: str, args: list[str]) -> tuple[bool, str]:
    """(whether `script ARGS` would start, what to print): its argparse parser is run on the
    arguments and stopped right after (a bad flag: usage and False)."""
    if "argparse" not in Path(script).read_text():
        return True, f"positional arguments {args} (not checked)"
    real = argparse.ArgumentParser.parse_args

    def parse_only(self, argv=None, namespace=None):
        real(self, argv, namespace)                   # a bad flag: usage and SystemExit(2)
        raise Parsed

    argv, path = sys.argv, list(sys.path)
    argparse.ArgumentParser.parse_args = parse_only
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    try:
        runpy.run_path(script, run_name="__main__")
    except Parsed:
        return True, "arguments accepted"
    except SystemExit as e:
        return False, f"refused its arguments (exit {e.code})"
    finally:
        argparse.ArgumentParser.parse_args = real
        sys.argv, sys.path[:] = argv, path
    return False, "finished without parsing its arguments"


def main():
    script, args = sys.argv[1], sys.argv[2:]
    ok, said = check(script, args)
    print(f"  {script}: {said}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
