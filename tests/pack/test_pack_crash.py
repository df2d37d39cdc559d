"""Crash safety: a save that fails or is killed leaves the old pack or the new one, never a
file that loads as something else; stray temporaries never load as a wrong pack."""
import os
import signal
import stat
import time

import pytest
import torch
from packutil import synthetic_snapshot

from muser.cache import Encoding, PlaneCut, SessionSnapshot
from muser.errors import PackError
from muser.pack import format as pf
from muser.pack import reader as pr


@pytest.fixture
def old(tmp_path):
    snap, _ = synthetic_snapshot(position=5)
    path = tmp_path / "session.pack"
    pf.save_pack(snap, path)
    return snap, path


class FileWrapper:
    """An open file that counts its writes (`n`) and passes everything else through; subclasses
    decide what a write does."""

    def __init__(self, f):
        self.f, self.n = f, 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return self.f.__exit__(*a)

    def __getattr__(self, name):
        return getattr(self.f, name)

def leftovers(directory, name="session.pack"):
    return [directory / f for f in os.listdir(directory) if f != name]


@pytest.mark.parametrize("fail", ["replace", "fsync", "write"])
def test_failed_save_leaves_the_old_file_and_no_temporary(old, monkeypatch, fail):
    snap_old, path = old
    new, _ = synthetic_snapshot(position=9)

    def boom(*a, **k):
        raise OSError(f"injected {fail} failure")
    if fail == "write":                                # disk full after the header
        real_open = open

        class Full(FileWrapper):
            def write(self, b):
                self.n += 1
                if self.n == 2:
                    raise OSError(28, "No space left on device (injected)")
                return self.f.write(b)
        monkeypatch.setattr(pf, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    else:
        monkeypatch.setattr(os, fail, boom)
    with pytest.raises(OSError, match="injected"):
        pf.save_pack(new, path)
    monkeypatch.undo()
    assert pr.load_pack(path).equal(snap_old)
    assert leftovers(path.parent) == []


def test_save_fsyncs_the_file_and_its_directory(tmp_path, monkeypatch):
    seen = []
    real = os.fsync

    def spy(fd):
        seen.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real(fd)
    monkeypatch.setattr(os, "fsync", spy)
    pf.save_pack(synthetic_snapshot()[0], tmp_path / "a.pack")
    assert seen == [False, True]                       # the file, then the directory after the rename
    assert stat.S_IMODE(os.stat(tmp_path / "a.pack").st_mode) == 0o600


class Stall(FileWrapper):
    """A file wrapper that announces the third write on `fd` and then sleeps (is killed there)."""

    def __init__(self, f, fd):
        super().__init__(f)
        self.fd = fd

    def write(self, b):
        self.n += 1
        if self.n == 3:                                   # the header slot is reserved, data half written
            self.f.flush()
            os.write(self.fd, b"M")
            time.sleep(60)
        return self.f.write(b)


def fork_and_kill(path, mode, delay):
    """A forked writer saves a 48 MiB snapshot to `path` in a loop and is SIGKILLed:
    mode "mid-write" at a known point inside the data, "loop" after `delay` seconds."""
    g = torch.Generator().manual_seed(0)
    planes = tuple(PlaneCut(i, "growing", None, 0, 4096, torch.randn(4096, 2, 256, generator=g),
                            torch.randn(4096, 2, 256, generator=g)) for i in range(3))
    snap = SessionSnapshot(4096, Encoding("ring", "float32"), planes, (), {})
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                          # the child never returns into pytest
        try:
            os.close(r)
            if mode == "mid-write":
                pf.open = lambda *a, **k: Stall(open(*a, **k), w)
            os.write(w, b"R")
            while True:
                pf.save_pack(snap, path)
        finally:
            os._exit(1)
    os.close(w)
    try:
        assert os.read(r, 1) == b"R"
        if mode == "mid-write":
            assert os.read(r, 1) == b"M"
        time.sleep(delay)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)


def check_directory(old_snap, path):
    """The target is the old pack or a complete new one; temporaries are refused or complete."""
    snap = pr.load_pack(path)
    assert snap.equal(old_snap) or snap.position == 4096
    partial = 0
    for f in leftovers(path.parent):
        assert f.name.startswith(".session.pack.") and f.name.endswith(".tmp")
        try:
            assert pr.load_pack(f).position == 4096            # killed after the last byte: complete
        except PackError:
            partial += 1
    return partial


def test_writer_killed_mid_save_leaves_old_or_new(old):
    snap_old, path = old
    fork_and_kill(path, "mid-write", 0.0)
    assert pr.load_pack(path).equal(snap_old)                 # never renamed
    assert check_directory(snap_old, path) == 1               # the partial temporary is refused
    for f in leftovers(path.parent):
        os.unlink(f)
    for delay in (0.05, 0.2, 0.45):                           # real saves in a loop, killed anywhere
        fork_and_kill(path, "loop", delay)
        check_directory(snap_old, path)


def test_a_successful_save_removes_temporaries_of_dead_writers_only(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".session.pack.{dead}.abc123.tmp"
        running = tmp_path / f".session.pack.{live.pid}.def456.tmp"
        other = tmp_path / f".other.pack.{dead}.ghi789.tmp"
        for f in (stale, running, other):
            f.write_bytes(b"partial")
        pf.save_pack(synthetic_snapshot()[0], tmp_path / "session.pack")
        assert not stale.exists()                   # its writer is gone
        assert running.exists() and other.exists()  # a live writer's, another target's
        assert pr.load_pack(tmp_path / "session.pack") is not None
    finally:
        live.kill()
        live.wait()
