"""The registry port's errors, named here for callers that import them from prebake.registry.errors
(they live in prebake.artifacts.ports.errors, the core's port)."""

from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    PublishConflict,
    RegistryError,
    RegistryNotFound,
    RegistryReadOnly,
    RegistryUnavailable,
    UnknownRegistryError,
)

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
