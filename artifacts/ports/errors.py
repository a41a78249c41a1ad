"""The registry port's errors: what a backend raises, and what the core tells apart.

A miss is `None`, never an error. RegistryUnavailable is a fault (down, refused, out of time):
the core reports it and tries the next registry. BlobDigestMismatch and BlobSizeMismatch are a
bad bundle: the core refuses it. This is the one home of every registry error: backends, the
core and the commands import them from here.
"""

from __future__ import annotations

from prebake.artifacts.errors import BundleError, PrebakeError

__all__ = [
    "BlobDigestMismatch",
    "BlobSizeMismatch",
    "PublishConflict",
    "RegistryError",
    "RegistryNotFound",
    "RegistryReadOnly",
    "RegistryUnavailable",
    "UnknownRegistryError",
    "UntrustedEntryError",
    "is_fault",
]


class RegistryError(PrebakeError):
    """A registry could not be reached, read or written (backends in registry/ subclass this)."""


class UnknownRegistryError(RegistryError, ValueError):
    """A registry address whose scheme prebake does not know."""


class UntrustedEntryError(RegistryError):
    """The registry already holds an entry for a key, and the trust policy in force refuses it."""


class RegistryNotFound(RegistryError, LookupError):
    """The registry an address names does not exist (a folder, bucket or repo): a wrong address, not an
    empty registry."""


class PublishConflict(RegistryError):
    """A different bundle already answers this key; the registry keeps the first one."""

    def __init__(self, message: str, existing_blob: str):
        super().__init__(message)
        self.existing_blob = existing_blob


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry is down, refused us, or did not answer in time."""


class RegistryReadOnly(RegistryError, PermissionError):
    """The registry can be read but not written here (offline mode, a pinned commit)."""


class BlobDigestMismatch(RegistryError, BundleError):
    """A downloaded blob's bytes do not hash to the digest that names it."""


class BlobSizeMismatch(BlobDigestMismatch):
    """A blob is not the size its manifest says: announced so, or it ran past it while streaming."""


def is_fault(error: BaseException) -> bool:
    """Whether `error` says the registry could not be asked (down, refusing us, out of time), as
    opposed to a bundle that is missing or bad."""
    return isinstance(error, RegistryUnavailable)
