"""`prebake ls`, `prebake verify`, quarantine and removal on an OCI registry (prebake.artifacts.ports.registry
Listable, Maintainable).

    <repo>:prebake-summary.<kind>      the listing summary of one kind (prebake.artifacts.ports.listing), as an artifact
                                       (artifactType application/vnd.prebake.summary.v1) whose one
                                       layer is the summary JSON; written back when it was missing or stale
    <repo>:quarantine-<kind>-<key>     an entry `prebake verify --quarantine` moved aside: its manifest
                                       with annotation org.prebake.quarantined (so another digest), then
                                       the original manifest deleted by digest, which removes its tag

A listing costs the tags API (one request per 1,000 tags) and one summary read; only entries the
summary lacks are read. The tags API carries names only, no version, so a summary row is trusted
for its tag name: entries are created once (see registry/oci/registry.py for the one race), and quarantine,
the only other change of what a tag names, removes the entry's row from the summary when it
removes the tag. Deletes need a registry that allows them (distribution: storage.delete.enabled).
A quarantined blob loses its link in this repository (a republish uploads it again); its bytes
stay in the registry's storage until the registry's own garbage collection.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.layout import index_relpath
from prebake.artifacts.ports.errors import RegistryError
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.registry.oci.artifact import canonical, tag_for
from prebake.registry.oci.files import OCIFiles, side_tag

log = logging.getLogger(__name__)

SUMMARY_TYPE = "application/vnd.prebake.summary.v1"
SUMMARY_LAYER_TYPE = "application/vnd.prebake.summary.v1+json"


def summary_tag(kind: str) -> str:
    tag_for(kind, "0" * 64)  # the same rules for kinds
    return f"prebake-summary.{kind}"


class OCIMaintenance(OCIFiles):
    """Mixed into OCIRegistry: listing, raw entries and quarantine through its client."""

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order; the tag name is the version."""
        yield from summarised_listing(self, self.entry_tags(kind))

    def index_entries(self) -> Iterator[tuple[str, bytes | PrebakeError]]:
        """Every entry as (index/<kind>/<key>.json, the prebake manifest's bytes or why they cannot be had)."""
        from prebake.registry.oci.artifact import manifest_from_config
        from prebake.registry.oci.artifact import read as read_entry

        for kind, digest, tag in self.entry_tags():
            where = f"{self.url}:{tag}"
            try:
                got = self.read_manifest(tag)
                if got is None:  # removed since the listing
                    continue
                entry = read_entry(got[0], where)
                raw = entry.inline
                if raw is None:
                    raw = manifest_from_config(self.read_small_blob(entry.config.digest, where), where)
                yield index_relpath(kind, digest), raw
            except BundleError as exc:
                yield index_relpath(kind, digest), exc

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> str:
        """Move an entry aside under a quarantine tag (and drop the bad blob's link); where it went."""
        tag = tag_for(kind, key_digest)
        got = self.read_manifest(tag)
        if got is None:
            raise RegistryError(f"cannot quarantine {kind} {key_digest[:16]}: {self.url}:{tag} is gone")
        body, digest = got
        aside = f"quarantine-{tag}"[:128]
        try:
            doc = json.loads(body)
            notes = doc.get("annotations") if isinstance(doc, dict) else None
            doc = dict(doc) if isinstance(doc, dict) else {}
            doc["annotations"] = {**(notes if isinstance(notes, dict) else {}), "org.prebake.quarantined": tag}
            copy = canonical(doc)
            self.put_manifest(aside, copy)
        except (ValueError, RegistryError) as exc:  # a manifest the registry will not take again: drop it anyway
            log.warning("cannot keep a copy of %s:%s (%s); removing the entry without one", self.url, tag, exc)
            aside = ""
        self.client.request("DELETE", f"manifests/{digest}", push=True, ok=(202, 404))
        if blob_digest is not None:
            self.client.request("DELETE", f"blobs/{blob_digest}", push=True, ok=(202, 404))
        self._forget_row(kind, key_digest)
        return f"{self.url}:{aside}" if aside else f"{self.url} (deleted)"

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an entry's manifest by digest (which removes its tag), then (if given) the blob's link
        and the side files' artifacts; the bytes go at the registry's own garbage collection."""
        got = self.read_manifest(tag_for(kind, key_digest))
        if got is not None:
            self.client.request("DELETE", f"manifests/{got[1]}", push=True, ok=(202, 404))
        self._forget_row(kind, key_digest)
        if blob_digest is None:
            return
        self.client.request("DELETE", f"blobs/{blob_digest}", push=True, ok=(202, 404))
        beside = side_tag(blob_digest, "x")[:-1]  # prebake-side.<hex>.
        for tag in [t for t in self.tags() if t.startswith(beside)]:
            if (side := self.read_manifest(tag)) is not None:
                self.client.request("DELETE", f"manifests/{side[1]}", push=True, ok=(202, 404))

    # -- the summary ----------------------------------------------------------------------------

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        def read(digest: str) -> Read:
            got = self._entry(tag_for(kind, digest))
            if got is None:
                return Read(digest, "", None)
            return Read(digest, tag_for(kind, digest), Listed.of(got[1]))

        with ThreadPoolExecutor(self.settings.concurrency, thread_name_prefix="prebake-oci-ls") as pool:
            yield from pool.map(read, digests)

    def _load_summary(self, kind: str) -> ListingSummary | None:
        tag, where = summary_tag(kind), f"{self.url}:{summary_tag(kind)}"
        try:
            raw = self.read_file(tag, SUMMARY_LAYER_TYPE)
            return None if raw is None else ListingSummary.parse(raw, where)
        except (BundleError, RegistryError) as exc:
            log.warning(
                "listing summary %s is unreadable (%s); reading every entry instead, and rewriting it", where, exc
            )
            return None

    def _store_summary(self, summary: ListingSummary) -> None:
        data = summary.to_bytes()
        if len(data) > MAX_MANIFEST_BYTES:
            return
        try:
            self.write_file(summary_tag(summary.kind), data, SUMMARY_TYPE, SUMMARY_LAYER_TYPE)
        except RegistryError as exc:
            log.warning(
                "cannot write the listing summary %s:%s (%s): listings stay correct but read every new entry "
                "until someone with push access lists this registry",
                self.url,
                summary_tag(summary.kind),
                exc,
            )

    def _forget_row(self, kind: str, key_digest: str) -> None:
        cached = self._load_summary(kind)
        if cached is None or not any(r.row.key_digest == key_digest for r in cached.rows):
            return
        rows = tuple(r for r in cached.rows if r.row.key_digest != key_digest)
        self._store_summary(ListingSummary(kind=kind, rows=rows))
