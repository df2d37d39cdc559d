"""The host's OpenMP threads: setup work must not leave a second pool behind.

Owns: `on_short_thread(fn, ...)`, which runs setup work (loading a model,
allocating a server's slots) on a fresh thread that exits when it is done.
Does not own: thread counts (torch's, and the native kernels'
`torch.get_num_threads()`).

Why.  libgomp keeps one worker pool per thread that has opened a parallel
region, for the life of that thread.  A worker spins at its barrier for a while
before it sleeps, so back-to-back regions (one per op; a layer has dozens) cost
a few microseconds -- unless the process holds more pool threads than CPUs:
then a worker spins 100 times at most and each region pays a futex sleep and
wake-up.  Loading a model opens regions on the loading thread (main); a
server then computes on its scheduler thread, which opens a second pool:

    threads   main + its worker (asleep) + scheduler + its worker = 4 > 2 CPUs
    measured  (2 CPUs, torch 2.13 / GCC 8 libgomp, embedded 270M at 2k context)
              prefill of 18 tokens  19 ms on the loading thread, 33-37 ms on another
              decode step           10 ms on the loading thread, 14 ms on another

`omp_pause_resource_all` does not help: after the GGUF dequantization this
libgomp keeps a worker it will not free.  A pool does die with its thread, so
setup work runs on a thread of its own and whichever thread computes next owns
the only pool (loading itself keeps both cores: 4.8 s, as on main).
"""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_short_thread(fn: Callable[..., T], *args, name: str = "muser-setup", **kwargs) -> T:
    """fn(*args, **kwargs) on a fresh thread, joined; its result, or its exception re-raised."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:        # noqa: BLE001 -- handed back to the caller as is
            box["error"] = e

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
