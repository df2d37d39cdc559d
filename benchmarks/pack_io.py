"""Session-pack I/O throughput against plain copies of the same bytes.

Owns: one measurement script.  Builds a synthetic snapshot with the embedded
270M model's cache geometry (18 layers: 15 sliding ring planes of `--window`
rows, 3 full growing planes of `--tokens` rows; 1 KV head x 256 dims, float32
by default) and times, best of `--repeats`:

  baselines   plain write of the pack's bytes (+ fsync + rename, the same durability),
              plain write without fsync, shutil.copyfile of the pack, plain read into memory,
              one SHA-256 pass over the bytes (single thread)
  packs       save_pack / load_pack without and with a key, to_bytes / from_bytes

GB/s = file bytes / seconds / 1e9, from the best wall time; CPU seconds (this
process, all threads, user + system) are reported too, since they are far less
sensitive to other work on a shared machine.  Reads come from the page cache
(the file was just written), as a restore of a recently saved session would.

    python benchmarks/pack_io.py                    # 32k tokens, ~217 MB pack
    python benchmarks/pack_io.py --tokens 8192 --repeats 3 --json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch

from muser.cache import Encoding, PlaneCut, SessionSnapshot
from muser.pack import format as pf
from muser.pack import reader as pr

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def synthetic(tokens: int, window: int, dtype: str, layers: int = 18, kv: int = 1, d: int = 256) -> SessionSnapshot:
    g = torch.Generator().manual_seed(0)
    planes = []
    for i in range(layers):
        full = (i + 1) % 6 == 0                      # Gemma 3: layers 5, 11, 17 are full attention
        count = tokens if full else min(tokens, window)
        k = torch.randn(count, kv, d, generator=g).to(DTYPES[dtype])
        v = torch.randn(count, kv, d, generator=g).to(DTYPES[dtype])
        planes.append(PlaneCut(i, "growing" if full else "ring", None if full else window,
                               tokens - count, count, k, v))
    fingerprint = {"architecture": "gemma3", "layers": [["full", None, True] if (i + 1) % 6 == 0
                                                        else ["sliding", window, True] for i in range(layers)],
                   "kv_heads": kv, "head_dim": d, "weights_digest": "0" * 64}
    return SessionSnapshot(tokens, Encoding("ring", dtype), tuple(planes),
                           tuple(int(t) for t in torch.randint(0, 262144, (tokens,), generator=g)), fingerprint)


def best(fn, repeats: int) -> tuple[float, float]:
    """(best wall seconds, best CPU seconds of this process, all threads, user + system)."""
    wall, cpu = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return min(wall), min(cpu)


def plain_write(data: bytes, path: str, durable: bool) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def plain_read(path: str) -> None:
    with open(path, "rb") as f:
        f.read()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir on the same disk as cwd)")
    ap.add_argument("--workers", type=int, default=None, help="hashing threads (default: format's own)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.workers:
        pf._WORKERS = pr._WORKERS = args.workers
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    snap = synthetic(args.tokens, args.window, args.dtype)
    key = b"benchmark-key"
    data = pf.pack_to_bytes(snap)
    n = len(data)
    d = tempfile.mkdtemp(prefix="muser-pack-bench-", dir=args.dir or os.getcwd())
    try:
        a, b, c = (os.path.join(d, x) for x in ("a.pack", "b.pack", "signed.pack"))
        plain_write(data, a, True)
        pf.save_pack(snap, c, key=key)
        rows = {
            "plain write + fsync + rename": best(lambda: plain_write(data, b, True), args.repeats),
            "plain write (no fsync)": best(lambda: plain_write(data, b, False), args.repeats),
            "plain copy (shutil.copyfile)": best(lambda: shutil.copyfile(a, b), args.repeats),
            "plain read into memory": best(lambda: plain_read(a), args.repeats),
            "sha256 over the bytes (1 thread)": best(lambda: hashlib.sha256(data).digest(), args.repeats),
            "save_pack, no key": best(lambda: pf.save_pack(snap, a), args.repeats),
            "save_pack, HMAC key": best(lambda: pf.save_pack(snap, c, key=key), args.repeats),
            "load_pack, no key": best(lambda: pr.load_pack(a), args.repeats),
            "load_pack, HMAC key": best(lambda: pr.load_pack(c, key=key), args.repeats),
            "to_bytes, no key": best(lambda: pf.pack_to_bytes(snap), args.repeats),
            "from_bytes, no key": best(lambda: pr.pack_from_bytes(data), args.repeats),
        }
        assert pr.load_pack(c, key=key).equal(snap)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    info = {"tokens": args.tokens, "window": args.window, "dtype": args.dtype, "file_bytes": n,
            "header_bytes": pr.read_manifest(data)["header_bytes"], "workers": pf._WORKERS,
            "load_average": os.getloadavg(), "cpus": os.cpu_count(),
            "wall_seconds": {k: w for k, (w, _) in rows.items()},
            "cpu_seconds": {k: c for k, (_, c) in rows.items()},
            "GB/s": {k: n / w / 1e9 for k, (w, _) in rows.items()}}
    if args.json:
        json.dump(info, sys.stdout, indent=2)
        print()
        return 0
    print(f"pack: {n:,} bytes ({n / 2**20:.1f} MiB; header {info['header_bytes']:,}), {args.tokens} tokens, "
          f"{args.dtype}, hashing threads {pf._WORKERS}, cpus {info['cpus']}, "
          f"load average {info['load_average'][0]:.2f}")
    print("| operation | wall s | GB/s (wall) | CPU s | GB per CPU-s |\n|---|---:|---:|---:|---:|")
    for k, (w, c) in rows.items():
        print(f"| {k} | {w:.3f} | {n / w / 1e9:.2f} | {c:.3f} | {n / c / 1e9 if c else float('inf'):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
