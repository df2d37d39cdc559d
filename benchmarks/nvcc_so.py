"""A CUDA C++ probe's source -> a shared library the probe loads with ctypes (nvcc, sm_90a).

Owns the one build recipe the hand-written probes share (cluster_merge_probe.py,
loader_warp_probe.py): the file named by a digest of everything it compiles, cached under
~/.cache/muser/cuda, nvcc's error tail as the exit message.  Not the package's C++ route
(muser/backends/cuda/cpp_dot.py builds through torch's extension loader).
"""
import hashlib
import shutil
import subprocess
from pathlib import Path

CACHE = Path.home() / ".cache" / "muser" / "cuda"
CSRC = Path(__file__).resolve().parents[1] / "muser" / "backends" / "cuda" / "csrc"


def build_so(stem: str, src: str, headers: tuple[str, ...] = ()) -> Path:
    """src (and the package's csrc/ headers it includes, named in `headers`) ->
    CACHE/<stem>-<digest>.so; an existing file of that digest is reused."""
    text = src + "".join((CSRC / h).read_text() for h in headers)
    out = CACHE / f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.so"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    cu = out.with_suffix(".cu")
    cu.write_text(src)
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    r = subprocess.run([nvcc, "-O3", "-gencode=arch=compute_90a,code=sm_90a", "-shared",
                        "-Xcompiler", "-fPIC", f"-I{CSRC}", "-o", str(out), str(cu)],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"nvcc failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    return out
