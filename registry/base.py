"""The registry protocol: where bundles live, the same index/ + blobs/ layout on every backend.

A backend answers four questions and nothing else. A miss is `None`, never an exception;
faults (down, refused, corrupt) raise RegistryError subclasses so callers can tell a miss
from an outage. Publishing writes the blob first and then creates the index entry only if
it is absent, so two bakers racing on one key cannot clobber each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from artifacts.manifest import Manifest


@dataclass(frozen=True)
class Published:
    """The outcome of a publish: created, or already there with the very same bundle."""

    manifest: Manifest
    created: bool
    where: str


@runtime_checkable
class Registry(Protocol):
    """Where bundles live. Every backend has the same layout: index/ and blobs/."""

    url: str

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        """The manifest that answers this key, or None."""

    def fetch_blob(self, digest: str, dest: Path) -> Path:
        """Download the blob named `digest` to `dest` (atomically), verify its sha256, return dest."""

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        """Store the blob, then create the index entry if absent. Raises PublishConflict if a
        different bundle already answers the key."""

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest in the index (of one kind, if given)."""
