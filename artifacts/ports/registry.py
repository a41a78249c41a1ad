"""The core's ports: what artifacts/ needs from a registry, declared here and implemented in registry/.

    Registry      lookup, fetch_blob, publish, list: every backend (folder, S3, Hub, Azure, OCI, chain)
    Maintainable  the optional abilities an operator tool uses: raw index entries, quarantine, removal
    Published     the outcome of a publish (created, or the very same bundle was there)
    Listable      the optional ability to list what `prebake ls` shows without reading every entry
    Chained       the optional ability to share a caller's time box among members (prebake.registry.chain)
    SideFiles     the optional ability to keep small files beside a blob and about the registry itself
    Buffered      a registry written out whole when finished (oci-layout:FILE.tar)
    OpenRegistry  how an address becomes a Registry (prebake.registry.open_registry, handed in)

A new object store: ObjectStore's six methods (ports/objects.py), StoreRegistry the rest. registry/ imports artifacts/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.ports.listing import Listed


@dataclass(frozen=True)
class Published:
    """The outcome of a publish: created, or already there with the very same bundle."""

    manifest: Manifest
    created: bool
    where: str


@runtime_checkable
class Registry(Protocol):
    """Where bundles live. Every backend has the same layout: index/ and blobs/.

    A miss is `None`, never an exception; faults (down, refused, corrupt) raise RegistryError
    subclasses so callers can tell a miss from an outage. `writable` is False for a registry
    that can only be read (an offline Hub, a Hub address pinned to a commit); chains skip such
    registries when they backfill.
    """

    url: str

    @property
    def writable(self) -> bool:
        """Whether publish can succeed here."""

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        """The manifest that answers this key, or None."""

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        """Download the blob named `digest` to `dest` (atomically), verify its sha256, return dest.

        `size`: the manifest's blob size; a blob that differs (announced or as it streams) is refused
        with BlobDigestMismatch as soon as it passes it, so no download runs past what was declared.
        `tee`: called with every chunk, in order, as it is written (the store unpacks while the blob
        downloads); an exception it raises stops the download. Only the return says the bytes fed to
        it were the right ones. A backend that waits on a download it cannot see (the Hub's, into its
        cache) calls it with no bytes now and then, so the consumer's time box can stop the wait."""

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        """Store the blob, then create the index entry if absent. Raises PublishConflict if a
        different bundle already answers the key."""

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest in the index (of one kind, if given)."""


@runtime_checkable
class Maintainable(Protocol):
    """A registry an operator can check and repair entry by entry (`prebake verify --quarantine`)."""

    def index_entries(self) -> Iterator[tuple[str, bytes]]:
        """Every index entry as (relative path, raw bytes), unparsed, so a checker can report a bad one."""

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> object:
        """Move an index entry (and, if given, its bad blob) aside; where it went."""

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry for good, then (if given) its blob and the files beside it: what ages
        out of a write-back quarantine (prebake.registry.review.aging). The entry goes first, so readers miss
        from then on; what is already gone is no error."""


@runtime_checkable
class Listable(Protocol):
    """A registry that lists `Listed` rows from a verified summary (prebake.artifacts.ports.listing) instead of
    reading every index entry; the same rows, in the same order, as `Listed.of` over `list()`."""

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order."""


@runtime_checkable
class Chained(Protocol):
    """A registry of members asked in turn, which can be told when the caller stops waiting: it
    shares what is left among the members still to ask and skips, for the rest of the run, one
    that faults or runs past its share, so the next member answers within the caller's box."""

    def lookup_by(self, kind: str, key_digest: str, deadline: float) -> Manifest | None:
        """`lookup`, answered by `deadline` (a time.monotonic() value)."""


# Checks a manifest before anything of it is installed; returns why it is refused, or None.
TrustCheck = Callable[[Manifest], "str | None"]


class OpenRegistry(Protocol):
    """How an address becomes a Registry: prebake.registry.open_registry, which the composition root
    (engine/compose.py) hands to the fetch pipeline's Source, since the core imports no backend."""

    def __call__(self, address: str, *, create: bool, home: Path | None) -> Registry: ...


MAX_SIDE_FILE_BYTES = 1 << 20  # an attestation is a few KiB; anything past this is not one


@runtime_checkable
class SideFiles(Protocol):
    """A registry that keeps small files beside a blob, at side/sha256/<aa>/<hex>/<name>
    (prebake.artifacts.layout.side_relpath): the bundle's provenance attestation, and whatever else
    describes one blob. Created once, like index entries; read bounded by MAX_SIDE_FILE_BYTES."""

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        """Create the side file; True if this call created it, False if one was there already."""

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        """The side file's bytes, or None when there is none (a miss, not an error)."""

    def put_meta(self, name: str, data: bytes) -> None:
        """Write meta/<name>, replacing what was there (atomically: a reader sees the old or the new)."""

    def get_meta(self, name: str) -> bytes | None:
        """meta/<name>'s bytes, or None when there is none."""


@runtime_checkable
class Buffered(Protocol):
    """A registry that buffers what is published and writes it out whole when told: `finish()` after
    the last publish (an oci-layout tar is one file, written atomically; a reader sees the old one
    until then). A registry that does not buffer writes as it goes and has no `finish`."""

    def finish(self) -> None:
        """Write out what was buffered; nothing to do when nothing was written."""
