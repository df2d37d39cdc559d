"""Write-behind to the disk tier: one thread, one object at a time, off the serving path.

Owns: the queue of cuts to write (each captured with its tensors when it was put, so evicting
it from RAM meanwhile loses nothing), writing a cut's missing blocks then the cut itself, and
what a failed write does: an `OSError` (a full disk, a read-only mount, a vanished directory)
degrades the store to its RAM tier -- logged once, counted, the queue dropped, nothing
half-written left indexed -- and the RAM tier serves on.
Does not own: file formats (disk.py) or the index's rules (index.py); it calls both under the
store's lock only for bookkeeping, never while writing bytes.
"""
from __future__ import annotations

import logging
import threading
from collections import deque

log = logging.getLogger("muser.store")


class Writer:
    def __init__(self, store):
        self.store = store
        self._jobs: deque = deque()
        self._cond = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="muser-store-writer", daemon=True)
        self._thread.start()

    def enqueue(self, cut, payload, rows) -> None:
        """`rows[j]`: the rows of cut.blocks[j] (None when that block already has a file)."""
        with self._cond:
            self._jobs.append((cut, payload, rows))
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued write has finished; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(10)

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs) + int(self._busy)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._jobs or self._stop)
                if not self._jobs:
                    return
                job = self._jobs.popleft()
                self._busy = True
            try:
                self._write(*job)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, cut, payload, rows) -> None:
        store, disk, index = self.store, self.store.disk, self.store.index
        try:
            if store.degraded:
                raise OSError("the disk tier is degraded")
            for b, r in zip(cut.blocks, rows):
                with store.lock:
                    done = b.on_disk
                if done:
                    continue
                if r is None:                      # no file and no rows captured: cannot happen
                    raise RuntimeError(f"block {b.index} has neither a file nor rows")
                digest, size = disk.write_block(b, r)
                with store.lock:
                    index.block_written(b, size)
            size = disk.write_cut(cut, payload)
            with store.lock:
                index.disk_in(cut, size)
                index.write_ended(cut)
                store.counts["disk_writes"] += 1
                index.evict("disk")
        except Exception as e:                     # noqa: BLE001 -- a write never breaks serving
            with store.lock:
                index.write_ended(cut)
                store.counts["disk_errors"] += 1
                first = not store.degraded
                store.degraded = store.degraded or isinstance(e, OSError)
            if first:
                log.warning("cut store: disk write failed (%s: %s); serving from RAM only",
                            type(e).__name__, e)
            if store.degraded:
                self._drop_queue()

    def _drop_queue(self) -> None:
        with self._cond:
            jobs, self._jobs = list(self._jobs), deque()
        with self.store.lock:
            for cut, _, _ in jobs:
                self.store.index.write_ended(cut)
