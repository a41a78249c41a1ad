"""The registry port's errors: what a backend raises, and what the core tells apart.

A miss is `None`, never an error. RegistryUnavailable is a fault (down, refused, out of time):
the core reports it and tries the next registry. BlobDigestMismatch and BlobSizeMismatch are a
bad bundle: the core refuses it. RegistryError, RegistryNotFound, UnknownRegistryError and
PublishConflict live in prebake.artifacts.errors and are named here too.
"""

from __future__ import annotations

from prebake.artifacts.errors import BundleError, PublishConflict, RegistryError, RegistryNotFound, UnknownRegistryError

__all__ = [
    "BlobDigestMismatch",
    "BlobSizeMismatch",
    "PublishConflict",
    "RegistryError",
    "RegistryNotFound",
    "RegistryReadOnly",
    "RegistryUnavailable",
    "UnknownRegistryError",
    "is_fault",
]


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
