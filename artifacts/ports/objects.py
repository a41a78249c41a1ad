"""The object-store port: the six things a registry needs from where it keeps its objects.

    head(key), get(key, limit)         an object's size and version tag; a small object's bytes and tag
    read(key, first, last)             an object's bytes, or a range, in chunks (parallel ranged downloads)
    put(key, data, create_only=...)    write bytes or a file; create-only answers False when taken
    delete(key), list(prefix)          remove (already gone is no error); every key under a prefix, in order

Optional: Movable (move, an atomic rename) and Batching (put_many unless a key is there: a store
whose every write is a commit publishes blob and entry in one). Keys are the registry layout
(prebake.artifacts.layout); a miss is None; errors are RegistryUnavailable, RegistryNotFound or
RegistryError (prebake.artifacts.ports.errors). The registry's behaviour over this port is
written once, in prebake.registry.shared.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Stored:
    """One object as head and list see it: its key, size, and a tag that changes with its bytes."""

    key: str
    size: int
    tag: str


@runtime_checkable
class ObjectStore(Protocol):
    """Where a registry's objects live: a folder, a bucket, a repository, a container."""

    url: str  # the registry's address, as messages name it
    writable: bool

    def head(self, key: str) -> Stored | None:
        """The object's size and tag, or None when there is none."""

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """The object's bytes and tag, or None; an object over `limit` bytes is a BundleError."""

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        """Bytes first..last (inclusive; None: to the end) of the object, in chunks. The whole object
        (0, None) is one plain request, a range one ranged request."""

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        """Write the object (bytes, or a file's contents); create_only: False, writing nothing,
        when one is there already. True when this call wrote it."""

    def delete(self, key: str) -> None:
        """Remove the object; one that is already gone is no error."""

    def list(self, prefix: str) -> Iterator[Stored]:
        """Every object whose key starts with `prefix`, in key order."""


@runtime_checkable
class Movable(Protocol):
    """A store that can rename an object atomically (a folder): quarantine moves it in one step
    instead of copying it, then deleting the original."""

    def move(self, key: str, dest: str) -> bool:
        """Rename `key` to `dest`; False, moving nothing, when `key` is not there."""


@runtime_checkable
class Batching(Protocol):
    """A store that writes several objects in one step (the Hub: one commit): publishing writes the
    blob and its index entry together, and the entry's creation stays create-only."""

    def put_many(self, objects: Sequence[tuple[str, bytes | Path]], *, unless: str) -> bool:
        """Write every object in one step, unless `unless` is there already: then False, writing nothing."""
