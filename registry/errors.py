"""Errors of the registry layer, rooted in prebake's one base error."""

from __future__ import annotations

from artifacts.errors import BundleError, PrebakeError


class RegistryError(PrebakeError):
    """A registry could not be reached, read or written."""


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry is down, refused us, or did not answer in time."""


class UnknownRegistryError(RegistryError, ValueError):
    """A registry address whose scheme prebake does not know."""


class PublishConflict(RegistryError):
    """A different bundle already answers this key; the registry keeps the first one."""

    def __init__(self, message: str, existing_blob: str):
        super().__init__(message)
        self.existing_blob = existing_blob


class RegistryReadOnly(RegistryError, PermissionError):
    """The registry can be read but not written here (offline mode, a pinned commit)."""


class BlobDigestMismatch(RegistryError, BundleError):
    """A downloaded blob's bytes do not hash to the digest that names it."""
