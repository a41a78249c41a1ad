"""Errors of the registry layer, rooted in prebake's one base error.

RegistryError, UnknownRegistryError and PublishConflict belong to the core's port (prebake.artifacts.errors); they are
named here too so backends and callers find every registry error in one module.
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
]


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry is down, refused us, or did not answer in time."""


class RegistryReadOnly(RegistryError, PermissionError):
    """The registry can be read but not written here (offline mode, a pinned commit)."""


class BlobDigestMismatch(RegistryError, BundleError):
    """A downloaded blob's bytes do not hash to the digest that names it."""


class BlobSizeMismatch(BlobDigestMismatch):
    """A blob is not the size its manifest says: announced so, or it ran past it while streaming."""
