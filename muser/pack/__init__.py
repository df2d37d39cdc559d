"""muser.pack: session packs -- one durable, portable, authenticated file per session cut.

Owns: the file format (format.py documents it byte for byte; docs/pack-format.md),
the manifest, seal and model gate (manifest.py) and the `muser pack` commands
(cli.py).  Does not own: what a cut is (muser.cache.snapshot) or restoring it
into a session (muser.engine).
"""
from .format import (load_pack, pack_from_bytes, pack_to_bytes, read_manifest, read_pack, save_pack,
                     verify)
from .manifest import check_model, load_key

__all__ = ["save_pack", "load_pack", "pack_to_bytes", "pack_from_bytes", "verify", "read_manifest", "read_pack",
           "check_model", "load_key"]
