"""muser.pack: session packs -- one durable, portable, authenticated file per session cut.

Owns: the file format and durable writes (format.py documents it byte for byte;
docs/pack-format.md), the checked reads and the order of their checks (reader.py), the
manifest, seal, model gate and the pack key (manifest.py), and the save/load
conveniences below.  Does not own: what a cut is (muser.cache.snapshot),
restoring it into a session (muser.engine) or the `muser pack` commands
(muser/cli/pack.py).
"""
from .format import pack_to_bytes, save_pack
from .manifest import check_model, load_key
from .reader import load_pack, pack_from_bytes, read_manifest, read_pack, verify

__all__ = ["save_pack", "load_pack", "pack_to_bytes", "pack_from_bytes", "verify", "read_manifest", "read_pack",
           "check_model", "load_key"]
