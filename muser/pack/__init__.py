"""muser.pack: session packs -- one durable, portable, authenticated file per session cut.

Owns: the file format (format.py documents it byte for byte; docs/pack-format.md),
the manifest, seal, model gate and the pack key (manifest.py), and the save/load
conveniences below.  Does not own: what a cut is (muser.cache.snapshot),
restoring it into a session (muser.engine) or the `muser pack` commands
(muser/cli/pack.py).
"""
from .format import (load_pack, pack_from_bytes, pack_to_bytes, read_manifest, read_pack, save_pack,
                     verify)
from .manifest import check_model, load_key

__all__ = ["save_pack", "load_pack", "pack_to_bytes", "pack_from_bytes", "verify", "read_manifest", "read_pack",
           "check_model", "load_key"]
