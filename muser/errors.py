"""Every typed exception muser raises, in one place.

Owns: the exception hierarchy and the wording of each message (what was
expected, what was found, which layer / field / position).
Does not own: deciding when to raise -- callers do that, before they write.

Hierarchy::

    MuserError
      CacheError
        CacheDiscontinuity      append at a position that is not origin_logical + len
        CacheOverflow           a growing plane asked past max_context
        CheckpointError         rollback/commit misuse (stale or foreign checkpoint, bad keep)
        SnapshotError
          SnapshotShapeError    the cut contract's shape gate (layer, field, expected, got)
          EncodingMismatch      a cut of one encoding offered to a session of another
      PackError
        PackIntegrityError      a digest, length or structure check failed
        PackAuthError           HMAC missing / wrong / key required
        PackVersionError        unknown major version
        PackModelMismatch       the pack's model fingerprint is not this model's
        PackEncodingMismatch    (also an EncodingMismatch)
        PackShapeError          (also a SnapshotShapeError)
      StoreError                the cut store (muser.store) refused an operation
        StoreMismatch           a session of another model / encoding / block size than the store's
        StoreMiss               a hit that is no longer installable (evicted, or its file went bad)
          StoreCorrupt          a disk-tier file refused (integrity, auth, foreign); it was removed
      ModelError
        ModelFormatError        unreadable / unsupported weights or config
        TokenizerUnavailable    a text API on a model loaded without tokenizer files
      RequestError              bad generation arguments (also ValueError)
      EnvError                  a MUSER_* environment variable with a value it does not accept
        ParameterError          one named request field is out of its limits (carries `param`)
      ContextOverflow           a prompt that cannot fit the context (server policy)
"""
from __future__ import annotations


class MuserError(Exception):
    """Root of every error muser raises on purpose."""


# --------------------------------------------------------------------------- cache
class CacheError(MuserError):
    pass


class CacheDiscontinuity(CacheError):
    """An append asked for a position other than the next one; nothing was written."""

    def __init__(self, layer: int, expected: int, got: int):
        self.layer, self.expected, self.got = layer, expected, got
        super().__init__(
            f"KV cache for layer {layer} expected logical position {expected}, got {got}"
        )


class CacheOverflow(CacheError):
    """A reservation past the plane's max_context; nothing was written."""

    def __init__(self, layer: int, max_context: int, requested: int):
        self.layer, self.max_context, self.requested = layer, max_context, requested
        super().__init__(
            f"KV cache for layer {layer} holds at most {max_context} positions, "
            f"a reservation needs {requested}"
        )


class CheckpointError(CacheError):
    pass


class SnapshotError(CacheError):
    pass


class SnapshotShapeError(SnapshotError):
    """The cut contract's shape gate refused a plane before anything was installed."""

    def __init__(self, layer: int, field: str, expected, got):
        self.layer, self.field, self.expected, self.got = layer, field, expected, got
        super().__init__(
            f"snapshot plane for layer {layer}: {field} expected {expected!r}, got {got!r}"
        )


class EncodingMismatch(SnapshotError):
    def __init__(self, expected, got):
        self.expected, self.got = expected, got
        super().__init__(f"snapshot encoding expected {expected}, got {got}")


# --------------------------------------------------------------------------- packs
class PackError(MuserError):
    pass


class PackIntegrityError(PackError):
    pass


class PackAuthError(PackError):
    pass


class PackVersionError(PackError):
    pass


class PackModelMismatch(PackError):
    pass


class PackEncodingMismatch(PackError, EncodingMismatch):
    def __init__(self, expected, got):
        EncodingMismatch.__init__(self, expected, got)


class PackShapeError(PackError, SnapshotShapeError):
    def __init__(self, layer: int, field: str, expected, got):
        SnapshotShapeError.__init__(self, layer, field, expected, got)


# --------------------------------------------------------------------------- cut store
class StoreError(MuserError):
    """The cut store refused an operation; nothing in the store or the session changed."""


class StoreMismatch(StoreError):
    """A session whose model, encoding or plane layout is not the store's."""


class StoreMiss(StoreError):
    """A hit that can no longer be installed (evicted since the lookup, or its file went bad)."""


class StoreCorrupt(StoreMiss):
    """A disk-tier file failed a check (integrity, HMAC, model, encoding, chain); it was removed."""

    def __init__(self, path, reason: str):
        self.path, self.reason = str(path), reason
        super().__init__(f"cut store file {self.path} refused: {reason}")


# --------------------------------------------------------------------------- model
class ModelError(MuserError):
    pass


class ModelFormatError(ModelError):
    pass


class TokenizerUnavailable(ModelError):
    pass


# --------------------------------------------------------------------------- requests
class RequestError(MuserError, ValueError):
    """Bad generation arguments (negative max_tokens, top_p outside (0, 1], ...)."""


class EnvError(MuserError, ValueError):
    """A MUSER_* environment variable set to something it does not accept (muser/env.py)."""

    def __init__(self, name: str, expected: str, got: str):
        self.name, self.expected, self.got = name, expected, got
        super().__init__(f"environment variable {name} expected {expected}, got {got!r}")


class ParameterError(RequestError):
    """One named request field is invalid: an unusable schema or grammar, a logit_bias key
    outside the vocabulary, ...  `param` is the field's path as a client spells it."""

    def __init__(self, param: str, message: str):
        self.param = param
        super().__init__(f"{param}: {message}")


class ContextOverflow(MuserError):
    """The retained context plus the output reserve cannot fit max_context."""

    def __init__(self, message: str, *, needed: int, limit: int):
        self.needed, self.limit = needed, limit
        super().__init__(message)
