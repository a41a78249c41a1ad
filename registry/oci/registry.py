"""The OCI registry backend: one repository of an OCI registry through the distribution API.

    oci://HOST[:PORT]/NAMESPACE/REPO
      <kind>-<key digest>         one image manifest per bundle (registry/oci/artifact.py)
      prebake-{side,meta,summary}.*   small files, through OCIFiles (registry/oci/files.py)
      quarantine-<kind>-<key>     an entry `prebake verify --quarantine` moved aside

May touch that repository only, through registry/oci/client.py. Side files and summaries are the
shared parts' (registry/shared/parts.py). OCI tags are last-writer-wins, so publishing is create-only
in effect: blobs, the manifest by digest, a last look at the tag, the tag, and a read-back after
`settle_s` (at least four round trips); whoever the tag then names won, the other is told.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.errors import BundleError, PrebakeError
from prebake.artifacts.layout import index_relpath
from prebake.artifacts.ports.errors import RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.artifacts.ports.registry import Published
from prebake.registry.oci.address import OCIAddress, OCISettings
from prebake.registry.oci.artifact import (
    MANIFEST_TYPE,
    MAX_OCI_MANIFEST_BYTES,
    Artifact,
    Blob,
    Entry,
    build,
    canonical,
    diff_id,
    manifest_from_config,
    parse_manifest,
    parse_tag,
    sha256,
    tag_for,
)
from prebake.registry.oci.artifact import read as read_entry
from prebake.registry.oci.blob import download
from prebake.registry.oci.client import Distribution
from prebake.registry.oci.files import OCIFiles
from prebake.registry.shared.http import Bound, pause, read_bounded
from prebake.registry.shared.parts import SharedParts, publishing, vanished
from prebake.registry.shared.transfer import SizedSink, check_publishable, corrupt, read_ahead, settle

log = logging.getLogger(__name__)

_REFUSED_OCI = b"accept header does not support OCI manifests"
_NAME_UNKNOWN = b'"NAME_UNKNOWN"'  # the distribution error code of a repository the registry does not know
_READ_S = 30.0  # an entry is small: one that takes longer to arrive is stalled or hostile


class OCIRegistry(SharedParts):
    """Bundles in one repository of an OCI registry: Registry, Maintainable, Listable, SideFiles."""

    writable = True

    def __init__(
        self,
        address: str,
        settings: OCISettings | None = None,
        env: Mapping[str, str] | None = None,
        *,
        must_exist: bool = False,
    ):
        env = os.environ if env is None else env
        self.must_exist = must_exist  # a repository that is not there: RegistryNotFound, not empty (read-only commands)
        self._known = False  # the repository was seen to exist
        self.address = OCIAddress.parse(address)
        self.url = self.address.url
        self.settings = settings or OCISettings.from_env(env)
        self.client = Distribution(self.address, self.settings, env)
        self.readers = self.settings.concurrency
        self.files = self.summaries = OCIFiles(self)

    # -- reading ------------------------------------------------------------------------------

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        got = self._entry(tag_for(kind, key_digest))
        return None if got is None else got[1]

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        where, dest = f"{self.url}@{digest}", Path(dest)
        sized = SizedSink(size, digest, where, self.url, tee)
        with fsutil.atomic_target(dest) as tmp, tmp.open("w+b") as f:  # read back as parts land out of order
            got = download(self.client, digest, f, sized)
            sized.finish()
            if got != digest:
                raise corrupt(where, got, digest, self.url)
        return dest

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest, in (kind, key digest) order: the tags API names the entries, then they are
        read `concurrency` at a time, as they are consumed."""

        def read(tag: str) -> Manifest | None:
            got = self._entry(tag)
            return None if got is None else got[1]

        tags = (tag for _, _, tag in self.entry_tags(kind))
        yield from read_ahead(tags, read, readers=self.readers, name="prebake-oci-list")

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        blob = Path(blob)
        with ThreadPoolExecutor(2, thread_name_prefix="prebake-oci-hash") as pool:  # both hash outside the GIL
            checked, layer_id = pool.submit(check_publishable, manifest, blob), pool.submit(diff_id, blob)
            checked.result()
            uncompressed = layer_id.result()
        tag = tag_for(manifest.kind, manifest.key_digest)
        where = f"{self.url}:{tag}"
        existing = self.lookup(manifest.kind, manifest.key_digest)
        if existing is not None:
            return settle(existing, manifest, where)
        artifact = build(manifest, uncompressed)
        started = time.monotonic()
        with publishing(self.url):
            self.push_blob(artifact.layer, blob)
            self.push_bytes(artifact.config_ref, artifact.config)
            self.put_manifest(artifact.digest, artifact.manifest)
            rtt = time.monotonic()
            before = self._entry(tag)  # the last look: someone may have won while our blobs went up
            if before is None:
                self.put_manifest(tag, artifact.manifest)
            rtt = time.monotonic() - rtt
        if before is not None:
            return settle(before[1], manifest, where)
        return self._settled(artifact, manifest, tag, where, rtt, time.monotonic() - started)

    def _settled(
        self, artifact: Artifact, manifest: Manifest, tag: str, where: str, rtt: float, took: float
    ) -> Published:
        """Wait until a racing tag write would have landed, then see whose manifest the tag names."""
        time.sleep(max(self.settings.settle_s, 4 * rtt))
        got = self._entry(tag)
        if got is None:
            raise vanished(where, "tags", "the registry's retention or cleanup policies")
        digest, stored = got
        if digest == artifact.digest:
            log.debug("published %s in %.2f s", where, took)
            return Published(manifest, created=True, where=where)
        return settle(stored, manifest, where)  # a racing publisher's tag landed after ours: theirs stands

    def push_blob(self, ref: Blob, path: Path) -> None:
        """Upload a file as a blob unless the repository has it (monolithic: POST, then one PUT)."""
        if self._has_blob(ref):
            return

        def chunks() -> Iterator[bytes]:
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk

        self._upload(ref, chunks)

    def push_bytes(self, ref: Blob, data: bytes) -> None:
        if not self._has_blob(ref):
            self._upload(ref, lambda: iter((data,)))

    def put_manifest(self, reference: str, body: bytes) -> str:
        """PUT a manifest under a tag or its digest; the digest the registry computed."""
        r = self.client.request(
            "PUT", f"manifests/{reference}", push=True, headers={"Content-Type": MANIFEST_TYPE}, content=body, ok=(201,)
        )
        return str(r.headers.get("Docker-Content-Digest", ""))

    def delete_manifest(self, digest: str) -> None:
        """Delete a manifest by digest, which removes its tags; one already gone is no error."""
        self.client.request("DELETE", f"manifests/{digest}", push=True, ok=(202, 404))

    def _upload(self, ref: Blob, chunks: Callable[[], Iterator[bytes]]) -> None:
        for attempt in range(self.settings.max_attempts):
            start = self.client.request("POST", "blobs/uploads/", push=True, ok=(202,))
            location = start.headers.get("Location", "")
            if not location:
                raise RegistryError(
                    f"{self.url} opened an upload without a Location; it does not speak the distribution API"
                )
            url = httpx.URL(self.client.base).join(location).copy_merge_params({"digest": ref.digest})
            headers = {"Content-Type": "application/octet-stream", "Content-Length": str(ref.size)}
            try:
                with self.client.stream(
                    "PUT", str(url), push=True, headers=headers, content=chunks(), ok=(201,), retry=False
                ):
                    return
            except RegistryUnavailable:
                if attempt == self.settings.max_attempts - 1:
                    raise
                pause(attempt)

    def _has_blob(self, ref: Blob) -> bool:
        r = self.client.request("HEAD", f"blobs/{ref.digest}", ok=(200, 404))
        return r.status_code == 200 and int(r.headers.get("Content-Length") or -1) == ref.size

    # -- entries ------------------------------------------------------------------------------

    def _entry(self, tag: str) -> tuple[str, Manifest] | None:
        """(manifest digest, prebake manifest) of the entry `tag` names; None when there is none."""
        parsed = parse_tag(tag)
        assert parsed is not None, tag
        got = self._entry_bytes(tag)
        if got is None:
            return None
        digest, entry, raw = got
        return digest, parse_manifest(raw, entry, parsed[0], parsed[1], f"{self.url}:{tag}")

    def _entry_bytes(self, tag: str) -> tuple[str, Entry, bytes] | None:
        """(manifest digest, its OCI entry, the prebake manifest's bytes) of `tag`; None when there is none."""
        where = f"{self.url}:{tag}"
        got = self.read_manifest(tag)
        if got is None:
            return None
        entry = read_entry(got[0], where)
        raw = entry.inline
        if raw is None:
            raw = manifest_from_config(self.read_small_blob(entry.config.digest, where), where)
        return got[1], entry, raw

    def read_manifest(self, reference: str) -> tuple[bytes, str] | None:
        """A manifest's bytes (bounded in size and time) and digest; None on 404."""
        for attempt in range(self.settings.max_attempts):
            with self.client.stream("GET", f"manifests/{reference}", accept=MANIFEST_TYPE) as r:
                body = read_bounded(r, Bound(MAX_OCI_MANIFEST_BYTES, f"{self.url}:{reference}", within_s=_READ_S))
                if r.status_code != 404:
                    self._known = True
                    return body, sha256(body)
            if _REFUSED_OCI not in body:
                self._check_exists(body)
                return None
            # Not a miss: the manifest exists, but a server on the way would not hand it over as OCI
            # (a mirror whose upstream request lost the OCI Accept type, e.g. behind a proxy that keeps
            # only the last of repeated Accept headers, as Go's client sends them). Ask again, then fail.
            pause(attempt)
        raise RegistryUnavailable(
            f"{self.url}:{reference} exists, but the registry (or the upstream of its mirror) kept refusing to serve "
            f"it as an OCI manifest ({_REFUSED_OCI.decode()!r}); check the proxies and mirrors between here and "
            f"the registry: they must pass every Accept header on"
        )

    def read_small_blob(self, digest: str, where: str, *, limit: int = MAX_MANIFEST_BYTES) -> bytes:
        with self.client.stream("GET", f"blobs/{digest}") as r:
            if r.status_code == 404:
                raise RegistryError(
                    f"{where} names blob {digest[:23]}, which is missing; run `prebake verify --quarantine`"
                )
            body = read_bounded(r, Bound(limit, f"{where} blob {digest[:23]}", within_s=_READ_S))
        if sha256(body) != digest:
            raise BundleError(f"{where}: blob {digest[:23]} does not hash to its name: refusing it")
        return body

    def entry_tags(self, kind: str | None = None) -> tuple[tuple[str, str, str], ...]:
        """(kind, key digest, tag) of every index entry (of one kind), sorted: the tags API, page by page."""
        out = []
        for tag in self.tags():
            parsed = parse_tag(tag)
            if parsed is not None and (kind is None or parsed[0] == kind):
                out.append((parsed[0], parsed[1], tag))
        return tuple(sorted(out))

    def tags(self) -> Iterator[str]:
        """Every tag of the repository, following the tags API's Link pages."""
        url: str | None = "tags/list?n=1000"
        while url:
            r = self.client.request("GET", url)
            if r.status_code == 404:  # the repository does not exist yet: nothing published
                if self.must_exist:
                    raise RegistryNotFound(self._not_found())
                return
            self._known = True
            try:
                names = r.json().get("tags") or []
            except (ValueError, AttributeError):
                raise RegistryError(
                    f"{self.url} answered a tags list that is not JSON; is it an OCI registry?"
                ) from None
            yield from (str(n) for n in names)
            url = _next_link(r.headers.get("Link", ""), self.client.base)

    def _check_exists(self, missed: bytes) -> None:
        """After a 404: under `must_exist`, RegistryNotFound when the repository itself is unknown (the
        404 says NAME_UNKNOWN, or, as distribution answers MANIFEST_UNKNOWN for any repository, one
        short tags listing says so); asked once per registry, and only after a miss."""
        if not self.must_exist or self._known:
            return
        if _NAME_UNKNOWN not in missed:
            # a login that may pull but not list (some registries gate the tags API apart) says nothing
            r = self.client.request("GET", "tags/list?n=1", ok=(200, 401, 403, 404))
            if r.status_code != 404:
                self._known = True
                return
        raise RegistryNotFound(self._not_found())

    def _not_found(self) -> str:
        return (
            f"registry {self.url} does not exist: {self.address.host} knows no repository "
            f"{self.address.repository} (NAME_UNKNOWN); fix the registry address (oci://HOST/NAMESPACE/REPO), "
            f"or publish into it first (`prebake bake` and `doit bake` create it on their first push)"
        )

    def __repr__(self) -> str:
        return f"OCIRegistry({self.url!r})"

    # -- listing and maintenance (registry/oci/files.py's tags) -------------------------------

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order; the tag name is the version."""
        yield from summarised_listing(self, self.entry_tags(kind))

    def index_entries(self) -> Iterator[tuple[str, bytes | PrebakeError]]:
        """Every entry as (index/<kind>/<key>.json, the prebake manifest's bytes or why they cannot be had)."""
        for kind, digest, tag in self.entry_tags():
            try:
                got = self._entry_bytes(tag)
                if got is not None:  # None: removed since the listing
                    yield index_relpath(kind, digest), got[2]
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
        self.delete_manifest(digest)
        if blob_digest is not None:
            self.client.request("DELETE", f"blobs/{blob_digest}", push=True, ok=(202, 404))
        self._forget_row(kind, key_digest)
        return f"{self.url}:{aside}" if aside else f"{self.url} (deleted)"

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an entry's manifest by digest (which removes its tag), then (if given) the blob's link
        and the side files' artifacts; the bytes go at the registry's own garbage collection."""
        got = self.read_manifest(tag_for(kind, key_digest))
        if got is not None:
            self.delete_manifest(got[1])
        self._forget_row(kind, key_digest)
        if blob_digest is None:
            return
        self.client.request("DELETE", f"blobs/{blob_digest}", push=True, ok=(202, 404))
        self._remove_beside(blob_digest)

    # -- the summary's rows ----------------------------------------------------------------------------

    def _read_row(self, kind: str, digest: str) -> Read:
        got = self._entry(tag_for(kind, digest))
        return Read(digest, "", None) if got is None else Read(digest, tag_for(kind, digest), Listed.of(got[1]))

    def _forget_row(self, kind: str, key_digest: str) -> None:
        cached = self._load_summary(kind)
        if cached is None or not any(r.row.key_digest == key_digest for r in cached.rows):
            return
        rows = tuple(r for r in cached.rows if r.row.key_digest != key_digest)
        self._store_summary(ListingSummary(kind=kind, rows=rows))


def _next_link(header: str, base: str) -> str | None:
    """The rel="next" target of an RFC 5988 Link header (how the tags API pages)."""
    for part in header.split(","):
        if 'rel="next"' in part and "<" in part and ">" in part:
            return str(httpx.URL(base).join(part[part.index("<") + 1 : part.index(">")]))
    return None
