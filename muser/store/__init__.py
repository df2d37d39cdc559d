"""muser.store: a tiered store of exact cuts -- prefix reuse across requests, slots and restarts.

Owns: `CutStore` (store.py: put / longest_prefix / evict / stats; install.py: install /
install_longest / pin / hold, its `Installing` mixin), its index and eviction policy (index.py),
the stored objects (objects.py: shared prefix blocks and per-cut ring windows), the hash chain
that addresses them (chain.py) and the disk tier in the session-pack format (disk.py,
writer.py).  Imports muser.cache and muser.pack; never the engine's internals, the model or the
server -- a session and an engine are used only through their public attributes.

    store = muser.CutStore(engine, ram_bytes=256 << 20, disk_dir="~/.cache/muser/cuts")
    store.put(session)                          # the cut at session.position
    hit = store.longest_prefix(ids, limit=len(ids) - 1)
    if hit: store.install(other_session, hit)   # bitwise the snapshot that was put
"""
from .store import DEFAULT_BLOCK, CutStore, Hit, default_ram_bytes

__all__ = ["CutStore", "Hit", "DEFAULT_BLOCK", "default_ram_bytes"]
