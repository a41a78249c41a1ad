"""The registry behaviour every backend shares, written once: side files, registry files, listing
summaries, the rows a summary lacks, and the errors of publishing.

May touch only the ObjectStores it is given (prebake.artifacts.ports.objects): `files` for side/
and meta/, `summaries` for summary/. StoreRegistry (index.py) keeps its index and blobs in the same
store; the OCI backend keeps them as images under tags and its small files in an ObjectStore of
one-layer artifacts (registry/oci/files.py), so both reach these parts through one port.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError
from prebake.artifacts.layout import meta_relpath, side_folder_relpath, side_relpath, summary_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryReadOnly
from prebake.artifacts.ports.listing import ListingSummary, Read
from prebake.artifacts.ports.objects import ObjectStore
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES, Published, Registry
from prebake.registry.shared.transfer import check_publishable, settle

log = logging.getLogger(__name__)


class SharedParts(ABC):
    """SideFiles, and the summary side of Listable (prebake.artifacts.ports.listing's SummaryStore),
    over `files` and `summaries`; a backend gives `_read_row` (one index entry as a listing row)."""

    url: str
    readers: int
    files: ObjectStore
    summaries: ObjectStore

    # -- SideFiles ---------------------------------------------------------------------------

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        return self.files.put(side_relpath(blob_digest, name), data, create_only=True)

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        got = self.files.get(side_relpath(blob_digest, name), MAX_SIDE_FILE_BYTES)
        return None if got is None else got[0]

    def put_meta(self, name: str, data: bytes) -> None:
        self.files.put(meta_relpath(name), data)

    def get_meta(self, name: str) -> bytes | None:
        got = self.files.get(meta_relpath(name), MAX_SIDE_FILE_BYTES)
        return None if got is None else got[0]

    def _remove_beside(self, blob_digest: str) -> None:
        """Delete every file beside a blob (after its entry and the blob itself)."""
        for stored in list(self.files.list(side_folder_relpath(blob_digest) + "/")):
            self.files.delete(stored.key)

    # -- listing summaries -------------------------------------------------------------------

    @abstractmethod
    def _read_row(self, kind: str, digest: str) -> Read:
        """The entry (kind, digest) as a listing row with its version tag; Read(digest, "", None) when gone."""

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        with ThreadPoolExecutor(self.readers, thread_name_prefix="prebake-ls") as pool:
            yield from pool.map(lambda digest: self._read_row(kind, digest), digests)

    def _load_summary(self, kind: str) -> ListingSummary | None:
        key = summary_relpath(kind)
        try:
            got = self.summaries.get(key, MAX_MANIFEST_BYTES)
            return None if got is None else ListingSummary.parse(got[0], self._summary_where(key))
        except (BundleError, RegistryError) as exc:  # too large, not a summary, or unreadable
            log.warning("%s; reading every entry instead, and rewriting it", exc)
            return None

    def _store_summary(self, summary: ListingSummary) -> None:
        key = summary_relpath(summary.kind)
        try:
            self.summaries.put(key, summary.to_bytes())
        except RegistryError as exc:
            log.warning(
                "cannot write the listing summary %s (%s): listings stay correct but read every new entry "
                "until someone with write access lists this registry",
                self._summary_where(key),
                exc,
            )

    def _summary_where(self, key: str) -> str:
        return f"{self.summaries.url}/{key}"


def published_already(
    registry: Registry, manifest: Manifest, blob: Path, where: str, read_only: str
) -> Published | None:
    """The start of a publish: the blob must be the manifest's and the registry writable (else
    `read_only` says why not); a key taken already settles the publish (the outcome), else None."""
    check_publishable(manifest, blob)
    if not registry.writable:
        raise RegistryReadOnly(read_only)
    existing = registry.lookup(manifest.kind, manifest.key_digest)
    return None if existing is None else settle(existing, manifest, where)


@contextmanager
def publishing(url: str) -> Iterator[None]:
    """Name the registry in what a publish raises, keeping the error's kind (a fault stays a fault);
    a blob that failed its check is raised as it is."""
    try:
        yield
    except BlobDigestMismatch:
        raise
    except RegistryError as exc:
        raise type(exc)(f"cannot publish into {url}: {exc}") from exc


def vanished(where: str, things: str, check: str) -> RegistryError:
    """An entry a write just reported present that cannot be read back."""
    return RegistryError(
        f"{where} was written or reported present and then could not be read; something deletes {things} "
        f"behind prebake's back: check {check}"
    )


__all__ = ["SharedParts", "published_already", "publishing", "vanished"]
