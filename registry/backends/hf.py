"""The Hugging Face Hub backend: the registry layout inside a model or dataset repo.

    hf://<namespace>/<repo>[@revision]            a model repo; revision: a branch (default main)
    hf://datasets/<namespace>/<repo>[@revision]   a dataset repo                 or a commit sha (read-only)

    <repo>@<revision>
    ├── index/<kind>/<key-digest>.json
    └── blobs/sha256/<aa>/<digest>.tar.zst        the Hub keeps large files in its LFS/Xet storage

Reads go through hf_hub_download and so through huggingface_hub's cache (HF_HUB_CACHE):
a lookup downloads the index entry, a fetch downloads the blob into the cache and copies it,
verified, to its destination. Each read first asks with one HEAD and no retries, so an
unreachable Hub is reported at once (what is cached still serves). HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE and HF_HUB_CACHE are
read when the registry is opened and passed to every call, because huggingface_hub freezes
some of them into module constants when it is first imported.

Offline (HF_HUB_OFFLINE=1), lookups, fetches and listings read only what earlier online
reads left in the cache, and publishing is refused.

One publish is one commit holding the blob and its index entry; the repo is created
(private) on the first publish. The Hub has no If-None-Match, so creation is made
conditional on the branch head instead: read the head, check the entry is absent at that
very commit, and commit with parent_commit=head. If anything was committed in between, the
Hub refuses the commit (412) and we look again: the entry now exists (settle as the file
backend does), or another key moved the head (retry on the new head). No race remains
between publishers going through the Hub's commit API; a force-push with plain git can
still rewrite the branch behind it.

Listing (`prebake ls`): on the Hub a write is a commit, so the listing summary
(artifacts/ports/listing.py) is kept on this machine, in the folder the caller names (open_registry's
`home`: <home>/listing/hf-<digest of endpoint and repo>-<kind>.json; none: in memory). Its tag is each
entry's git blob id from the tree listing. Quarantine: a move is one commit that adds the copy and
deletes the original on top of the head it read; the history keeps every byte.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.bundle.payload import file_digest
from prebake.artifacts.layout import (
    blob_relpath,
    index_relpath,
    meta_relpath,
    parse_index_relpath,
    side_folder_relpath,
    side_relpath,
)
from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    RegistryError,
    RegistryNotFound,
    RegistryReadOnly,
    RegistryUnavailable,
)
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.shared.transfer import Published, copy_verified, read_ahead, retry_after_s, settle

log = logging.getLogger(__name__)

T = TypeVar("T")
_DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_ADDRESS = re.compile(r"^hf://(?:(datasets|models)/)?([\w.-]+/[\w.-]+)(?:@([^@\s]+))?/?$")
_COMMIT_ATTEMPTS = 5  # heads moved by other keys' publishes before we give up
_LIST_READERS = 8  # index entries read in parallel by list() and listing()
_ASKED_ATTEMPTS = 3  # a read the Hub answers 429 or 503 with Retry-After is asked this often in all
QUARANTINE = "quarantine"


class HubRegistry:
    """index/ + blobs/ inside a Hub repo, through huggingface_hub: Registry, Maintainable, Listable, SideFiles."""

    def __init__(
        self,
        address: str,
        *,
        cache_dir: Path | str | None = None,
        must_exist: bool = False,
        listing_dir: Path | None = None,
    ):
        self.repo_type, self.repo_id, self.revision = _parse_address(address)
        self.listing_dir = listing_dir  # where this machine keeps the listing summaries; None: in memory
        self._summaries: dict[str, ListingSummary] = {}
        self.must_exist = must_exist  # a repo that is not there: RegistryNotFound, not a miss (read-only commands)
        prefix = "datasets/" if self.repo_type == "dataset" else ""
        self.url = f"hf://{prefix}{self.repo_id}@{self.revision}"
        env = os.environ
        self.endpoint = (env.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT).rstrip("/")
        self.offline = env.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
        self._token = env.get("HF_TOKEN") or None  # None: huggingface_hub's saved login, if any
        self._cache_dir = str(cache_dir) if cache_dir else (env.get("HF_HUB_CACHE") or None)
        from huggingface_hub import HfApi

        self._api = HfApi(endpoint=self.endpoint, token=self._token)

    @property
    def writable(self) -> bool:
        return not self.offline and not _COMMIT_SHA.match(self.revision)

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        return self._read_index(index_relpath(kind, key_digest), self.revision)

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        """The Hub's copy lands in huggingface_hub's cache first (its size, as the Hub announces it,
        checked against `size` before the download); it is verified there, then copied to `dest`
        through `tee`, so the consumer is only ever fed a copy that already matched."""
        relpath, dest = blob_relpath(digest), Path(dest)
        cached = _probing(lambda: self._download(relpath, self.revision, limit=size), tee)
        if cached is None:
            if self.offline:
                raise RegistryUnavailable(
                    f"{self._where(relpath)} is not in the Hugging Face cache and HF_HUB_OFFLINE=1; fetch it once online"
                )
            raise RegistryError(
                f"blob {digest} is named by an index entry but missing at {self._where(relpath)}; run `prebake verify`"
            )
        try:
            self._copy_verified(cached, digest, dest, relpath, size)
        except BlobDigestMismatch:
            if self.offline:
                raise
            # The cached copy may be the corrupt one; the Hub's copy decides.
            log.warning("cached copy of %s is corrupt; downloading it again", self._where(relpath))
            cached = self._download(relpath, self.revision, force=True, limit=size)
            if cached is None:
                raise RegistryError(
                    f"blob {digest} vanished from {self._where(relpath)} while being fetched; retry"
                ) from None
            self._copy_verified(cached, digest, dest, relpath, size)
        if tee is not None:  # verified: now stream the very same bytes to the consumer
            self._copy_verified(cached, digest, dest, relpath, size, tee)
        return dest

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        if not self.writable:
            why = "HF_HUB_OFFLINE=1 is set; unset it" if self.offline else "it is pinned to a commit; name a branch"
            raise RegistryReadOnly(f"cannot publish to {self.url}: {why} to publish")
        blob = Path(blob)
        if file_digest(blob) != manifest.blob.digest:
            raise BlobDigestMismatch(f"{blob} does not hash to {manifest.blob.digest}; repack it before publishing")
        index = index_relpath(manifest.kind, manifest.key_digest)
        for _ in range(_COMMIT_ATTEMPTS):
            head = self._head(create=True)
            assert head is not None  # _head(create=True) creates the repo or raises
            existing = self._read_index(index, head)
            if existing is not None:
                return settle(existing, manifest, self._where(index))
            if self._publish_commit(manifest, blob, index, head):
                return Published(manifest, created=True, where=self._where(index))
        raise RegistryUnavailable(
            f"cannot publish into {self.url}: branch {self.revision} moved under each of {_COMMIT_ATTEMPTS} "
            f"attempts (other publishes); retry when the repo is quieter"
        )

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        folder = f"index/{kind}" if kind else "index"
        if self.offline:
            yield from self._list_cached(folder)
            return
        head = self._head(create=False)
        if head is None:
            return
        paths = [path for path, _ in self._index_files(folder, head)]  # one tree listing, then the entries
        yield from read_ahead(
            paths, lambda path: self._read_index(path, head), readers=_LIST_READERS, name="prebake-hf-list"
        )

    def _index_files(self, folder: str, head: str) -> Sequence[tuple[str, str]]:
        """(path, git blob id) of every index entry under `folder` at commit `head`, sorted: one tree listing."""
        from huggingface_hub import RepoFile
        from huggingface_hub.errors import RemoteEntryNotFoundError

        with self._faults(f"list {self.url}/{folder}"):
            try:
                entries = list(
                    self._api.list_repo_tree(
                        self.repo_id, path_in_repo=folder, recursive=True, repo_type=self.repo_type, revision=head
                    )
                )
            except RemoteEntryNotFoundError:
                return []
        return sorted((e.path, e.blob_id) for e in entries if isinstance(e, RepoFile) and parse_index_relpath(e.path))

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        """Commit the side file on top of the branch's head, unless the head already has it."""
        from huggingface_hub import CommitOperationAdd

        if not self.writable:
            raise RegistryReadOnly(f"cannot write a side file to {self.url}: it is read-only here")
        relpath = side_relpath(blob_digest, name)
        for _ in range(_COMMIT_ATTEMPTS):
            head = self._head(create=True)
            assert head is not None
            if self._present(relpath, head) is not None:
                return False
            operation = CommitOperationAdd(path_in_repo=relpath, path_or_fileobj=data)
            if self._commit([operation], relpath, head, f"prebake: {name} of blob {blob_digest[:23]}"):
                return True
        raise RegistryUnavailable(f"cannot write {relpath} to {self.url}: the branch kept moving; retry")

    def put_meta(self, name: str, data: bytes) -> None:
        from huggingface_hub import CommitOperationAdd

        if not self.writable:
            raise RegistryReadOnly(f"cannot write a registry file to {self.url}: it is read-only here")
        relpath = meta_relpath(name)
        self._head(create=True)
        with self._faults(f"commit {relpath} to {self.url}"):
            self._api.create_commit(
                self.repo_id,
                [CommitOperationAdd(path_in_repo=relpath, path_or_fileobj=data)],
                commit_message=f"prebake: update {relpath}",
                repo_type=self.repo_type,
                revision=self.revision,
            )

    def get_meta(self, name: str) -> bytes | None:
        relpath = meta_relpath(name)
        local = self._download(relpath, self.revision, limit=MAX_SIDE_FILE_BYTES, exact=False)
        return None if local is None else fsutil.read_bounded(local.resolve(), MAX_SIDE_FILE_BYTES)

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        relpath = side_relpath(blob_digest, name)
        local = self._download(relpath, self.revision, limit=MAX_SIDE_FILE_BYTES, exact=False)
        return None if local is None else fsutil.read_bounded(local.resolve(), MAX_SIDE_FILE_BYTES)

    def __repr__(self) -> str:
        return f"HubRegistry({self.url!r}, endpoint={self.endpoint!r})"

    # -- listing (Listable) -------------------------------------------------------------------

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every index entry (of one kind, if given), in list() order."""
        if self.offline:
            yield from (Listed.of(m) for m in self.list(kind))
            return
        head = self._head(create=False)
        if head is None:
            return
        entries = [
            (*parsed, blob_id)
            for path, blob_id in self._index_files(f"index/{kind}" if kind else "index", head)
            if (parsed := parse_index_relpath(path)) is not None
        ]
        yield from summarised_listing(_AtCommit(self, head, {(k, d): tag for k, d, tag in entries}), entries)

    def _summary_path(self, folder: Path, kind: str) -> Path:
        repo = hashlib.sha256(f"{self.endpoint}\n{self.repo_type}\n{self.repo_id}".encode()).hexdigest()[:24]
        return folder / f"hf-{repo}-{kind}.json"

    def _load_summary(self, kind: str) -> ListingSummary | None:
        if self.listing_dir is None:
            return self._summaries.get(kind)
        return ListingSummary.load(self._summary_path(self.listing_dir, kind))

    def _store_summary(self, summary: ListingSummary) -> None:
        if self.listing_dir is None:
            self._summaries[summary.kind] = summary
        else:
            summary.store(self._summary_path(self.listing_dir, summary.kind))

    # -- maintenance (Maintainable) ---------------------------------------------------------

    def index_entries(self) -> Iterator[tuple[str, bytes]]:
        """Every file under index/ at the head, as (path in the repo, raw bytes), unparsed."""
        head = self._head(create=False)
        if head is None:
            return
        for path in self._tree(head, "index"):
            if path.endswith(".json") and (local := self._download(path, head)) is not None:
                yield path, local.read_bytes()

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> str:
        """Move an index entry (then, if given, its bad blob) under quarantine/; return the entry's new place."""
        head = self._head(create=False)
        moved = self._move_aside(index_relpath(kind, key_digest), head) if head else None
        if moved is None:
            raise RegistryError(f"cannot quarantine {kind} {key_digest[:16]}: its index entry in {self.url} is gone")
        if blob_digest is not None and (head := self._head(create=False)) is not None:
            self._move_aside(blob_relpath(blob_digest), head)  # a repo gone meanwhile has no blob to move
        return moved

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry, then (if given) its blob and the files beside it, in one commit on the
        head it read (the history keeps the bytes; the head no longer names them)."""
        from huggingface_hub import CommitOperationDelete

        head = self._head(create=False)
        if head is None:
            return
        paths = [index_relpath(kind, key_digest)]
        if blob_digest is not None:
            paths += [blob_relpath(blob_digest), *self._tree(head, side_folder_relpath(blob_digest))]
        there = [p for p in paths if self._present(p, head)]
        if not there:
            return
        with self._faults(f"remove {self._where(there[0])}"):
            self._api.create_commit(
                self.repo_id,
                [CommitOperationDelete(path_in_repo=p) for p in there],
                commit_message=f"prebake promote --prune: remove {there[0]}",
                repo_type=self.repo_type,
                revision=self.revision,
                parent_commit=head,
            )

    def _tree(self, head: str, folder: str) -> Sequence[str]:
        from huggingface_hub import RepoFile
        from huggingface_hub.errors import RemoteEntryNotFoundError

        with self._faults(f"list {self.url}/{folder}"):
            try:
                entries = self._api.list_repo_tree(
                    self.repo_id, path_in_repo=folder, recursive=True, repo_type=self.repo_type, revision=head
                )
                return sorted(e.path for e in entries if isinstance(e, RepoFile))
            except RemoteEntryNotFoundError:
                return []

    def _move_aside(self, relpath: str, head: str) -> str | None:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        local = self._download(relpath, head, force=True)
        if local is None:
            return None
        dest = f"{QUARANTINE}/{relpath}"
        if self._present(dest, head):  # quarantined before: keep both for whoever investigates
            dest = f"{dest}.{time.time_ns()}"
        operations: Sequence[CommitOperationAdd | CommitOperationDelete] = [
            CommitOperationAdd(path_in_repo=dest, path_or_fileobj=str(local)),
            CommitOperationDelete(path_in_repo=relpath),
        ]
        with self._faults(f"quarantine {self._where(relpath)}"):
            self._api.create_commit(
                self.repo_id,
                operations,
                commit_message=f"prebake verify: quarantine {relpath}",
                repo_type=self.repo_type,
                revision=self.revision,
                parent_commit=head,
            )
        return str(self._where(dest))

    # -- reading ---------------------------------------------------------------------------

    def _read_index(self, relpath: str, revision: str) -> Manifest | None:
        local = self._download(relpath, revision, limit=MAX_MANIFEST_BYTES, exact=False)
        if local is None:
            return None
        return Manifest.parse(fsutil.read_bounded(local.resolve(), MAX_MANIFEST_BYTES), self._where(relpath))

    def _download(
        self, relpath: str, revision: str, *, force: bool = False, limit: int | None = None, exact: bool = True
    ) -> Path | None:
        """The cached file for `relpath` at `revision`; None if the repo, revision or file is absent.

        Online, one HEAD without retries comes first: hf_hub_download alone retries an
        unreachable Hub for about 20 s before falling back to its cache, and a lookup must
        fail fast. If the Hub is unreachable, a copy cached by an earlier read still serves
        (entries and blobs are never replaced, so a cached one is still the right one).
        """
        if self.offline:
            return self._cached_download(relpath, revision, local_only=True)
        try:
            announced = self._present(relpath, revision)
            if announced is None:
                return None
            if limit is not None and announced is not True and (announced > limit or (exact and announced != limit)):
                raise BlobDigestMismatch(
                    f"{self._where(relpath)} is {announced} bytes by the Hub's account, but it may be "
                    f"{'at most ' if not exact else ''}{limit}; refusing to download it: run "
                    f"`prebake verify --quarantine --registry {self.url}`"
                )
        except RegistryUnavailable:
            cached = None if force else self._cached_download(relpath, revision, local_only=True)
            if cached is None:
                raise
            log.warning("the Hub at %s is unreachable; using the cached %s", self.endpoint, self._where(relpath))
            return cached
        return self._cached_download(relpath, revision, local_only=False, force=force, limit=limit)

    def _present(self, relpath: str, revision: str) -> int | bool | None:
        """The file's size at `revision` (True if the Hub does not say), None if absent; one HEAD, no retries."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import (
            GatedRepoError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        url = hf_hub_url(self.repo_id, relpath, repo_type=self.repo_type, revision=revision, endpoint=self.endpoint)
        with self._faults(f"read {self._where(relpath)}"):
            try:
                meta = _as_asked(lambda: get_hf_file_metadata(url, token=self._token, endpoint=self.endpoint))
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except (RemoteEntryNotFoundError, RevisionNotFoundError):
                return None
            except RepositoryNotFoundError:
                if self.must_exist:
                    raise RegistryNotFound(self._not_found()) from None
                log.info("%s does not exist at %s, or HF_TOKEN may not read it: a miss", self.url, self.endpoint)
                return None
        return meta.size if isinstance(meta.size, int) else True

    def _cached_download(
        self, relpath: str, revision: str, *, local_only: bool, force: bool = False, limit: int | None = None
    ) -> Path | None:
        """hf_hub_download into the cache; None if absent there (local_only) or on the Hub. A body that runs
        past `limit` is refused while it comes (huggingface_hub reads until the server stops, then compares
        sizes): an index entry's, a blob's, whatever the HEAD before it said."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        with self._faults(f"download {self._where(relpath)}"):
            try:
                local = _as_asked(
                    lambda: hf_hub_download(
                        self.repo_id,
                        relpath,
                        repo_type=self.repo_type,
                        revision=revision,
                        endpoint=self.endpoint,
                        token=self._token,
                        cache_dir=self._cache_dir,
                        local_files_only=local_only,
                        force_download=force,
                        tqdm_class=_terminal_tqdm() if limit is None else _bounded_tqdm(limit, self._where(relpath)),
                    )
                )
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except LocalEntryNotFoundError as exc:
                if local_only:
                    return None
                raise RegistryUnavailable(
                    f"cannot download {self._where(relpath)}: the Hub at {self.endpoint} stopped answering and "
                    f"the file is not cached ({exc.__cause__ or exc}); check the network and HF_ENDPOINT, or set "
                    f"HF_HUB_OFFLINE=1 to work from the cache"
                ) from exc
            except (RemoteEntryNotFoundError, RevisionNotFoundError, RepositoryNotFoundError):
                return None  # deleted between our HEAD and the download
        return Path(local)

    def _copy_verified(
        self,
        src: Path,
        digest: str,
        dest: Path,
        relpath: str,
        size: int | None,
        tee: Callable[[bytes], None] | None = None,
    ) -> Path:
        return copy_verified(src, dest, digest, where=self._where(relpath), registry_url=self.url, size=size, tee=tee)

    def _list_cached(self, folder: str) -> Iterator[Manifest]:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            snapshot = Path(
                snapshot_download(
                    self.repo_id,
                    repo_type=self.repo_type,
                    revision=self.revision,
                    cache_dir=self._cache_dir,
                    local_files_only=True,
                    allow_patterns=[f"{folder}/**"],
                )
            )
        except LocalEntryNotFoundError:
            return
        for path in sorted(snapshot.glob(f"{folder}/**/*.json")):
            relpath = path.relative_to(snapshot).as_posix()
            if parse_index_relpath(relpath):  # cache entries are links into the cache's blobs/: follow them
                yield Manifest.parse(fsutil.read_bounded(path.resolve(), MAX_MANIFEST_BYTES), self._where(relpath))

    # -- writing ---------------------------------------------------------------------------

    def _head(self, *, create: bool) -> str | None:
        """The commit sha the revision points at; None if the repo is absent and not to be created."""
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        with self._faults(f"read the head of {self.url}"):
            try:
                return self._api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision).sha
            except RevisionNotFoundError as exc:
                if not create:
                    return None
                raise RegistryError(
                    f"{self.url}: branch {self.revision!r} does not exist; create it "
                    f"(`hf repo branch create {self.repo_id} {self.revision}`) or publish to main"
                ) from exc
            except RepositoryNotFoundError:
                if self.must_exist:
                    raise RegistryNotFound(self._not_found()) from None
                if not create:
                    return None
            self._api.create_repo(self.repo_id, repo_type=self.repo_type, private=True, exist_ok=True)
            log.info("created %s at %s", self.url, self.endpoint)
            return self._api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision).sha

    def _publish_commit(self, manifest: Manifest, blob: Path, index: str, head: str) -> bool:
        """One commit adding the blob and its index entry on top of `head`; False if the branch moved."""
        from huggingface_hub import CommitOperationAdd

        operations = [
            CommitOperationAdd(path_in_repo=blob_relpath(manifest.blob.digest), path_or_fileobj=str(blob)),
            CommitOperationAdd(path_in_repo=index, path_or_fileobj=manifest.to_bytes()),
        ]
        message = f"prebake: publish {manifest.kind} {manifest.key_digest[:16]}"
        about = f"blob {manifest.blob.digest} ({manifest.blob.size} bytes), built by {manifest.builder}"
        return self._commit(operations, index, head, message, about)

    def _commit(self, operations: Sequence[Any], relpath: str, head: str, message: str, description: str = "") -> bool:
        """One commit of `operations` on top of `head`; False if the branch moved since (look again)."""
        from huggingface_hub.errors import HfHubHTTPError

        with self._faults(f"commit {relpath} to {self.url}"):
            try:
                self._api.create_commit(
                    self.repo_id,
                    operations,
                    commit_message=message,
                    commit_description=description or None,
                    repo_type=self.repo_type,
                    revision=self.revision,
                    parent_commit=head,
                )
            except HfHubHTTPError as exc:
                if exc.response is not None and exc.response.status_code in (409, 412):
                    return False  # someone committed since we read the head
                raise
        return True

    def _where(self, relpath: str) -> str:
        return f"{self.url}/{relpath}"

    @contextmanager
    def _faults(self, doing: str) -> Iterator[None]:
        """Turn huggingface_hub's and the HTTP client's errors into registry errors that say what to do."""
        import httpx2
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError

        try:
            yield
        except (httpx2.TransportError, OfflineModeIsEnabled) as exc:
            raise RegistryUnavailable(
                f"cannot {doing}: the Hub at {self.endpoint} did not answer ({exc}); check the network and "
                f"HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to read from the cache"
            ) from exc
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else 0
            if isinstance(exc, RepositoryNotFoundError):
                raise RegistryNotFound(self._not_found()) from exc
            if isinstance(exc, GatedRepoError) or status in (401, 403):
                raise RegistryUnavailable(
                    f"cannot {doing}: the Hub refused us (HTTP {status}); set HF_TOKEN to a token that may "
                    f"read {self.repo_id} (and write to it, to publish)"
                ) from exc
            if status >= 500 or status == 429:
                raise RegistryUnavailable(
                    f"cannot {doing}: the Hub at {self.endpoint} failed (HTTP {status}); retry later"
                ) from exc
            raise RegistryError(f"cannot {doing}: {exc}") from exc
        except OSError as exc:
            if "Consistency check failed" not in str(exc):  # huggingface_hub's own size check
                raise
            raise BlobSizeMismatch(
                f"cannot {doing}: the Hub sent a body of another size than it announced ({exc}); the blob is "
                f"refused; run `prebake verify --deep --registry {self.url}`"
            ) from exc

    def _not_found(self) -> str:
        return (
            f"registry {self.url} does not exist at {self.endpoint}, or HF_TOKEN may not read it; fix the "
            f"registry address, or set HF_TOKEN to a token that may read {self.repo_id}"
        )


def _parse_address(address: str) -> tuple[str, str, str]:
    """(repo type, repo id, revision) of hf://[datasets/]<namespace>/<repo>[@revision]."""
    m = _ADDRESS.match(address)
    if not m:
        raise RegistryError(
            f"{address!r} is not a Hub address; write hf://<namespace>/<repo>[@revision] "
            f"or hf://datasets/<namespace>/<repo>[@revision]"
        )
    return ("dataset" if m.group(1) == "datasets" else "model"), m.group(2), m.group(3) or "main"


def _probing(call: Callable[[], T], tee: Callable[[bytes], None] | None) -> T:
    """`call` (a download into huggingface_hub's cache, which prebake sees no byte of until it ends) in a
    daemon thread, `tee` called with no bytes every quarter second meanwhile, so the consumer's time box
    (Store.install's deadline) ends the wait: a blob sent slowly no longer holds the fetch until its last
    byte. An abandoned download ends with the process (or completes into the cache, for the next fetch)."""
    if tee is None:
        return call()
    done: Future[T] = Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=run, name="prebake-hf-download", daemon=True).start()
    while True:
        try:
            return done.result(timeout=0.25)
        except TimeoutError:
            tee(b"")


def _as_asked(call: Callable[[], T]) -> T:
    """`call`, asked again after as long as the Hub asks when it answers 429 or 503 with Retry-After (at most
    MAX_RETRY_AFTER_S, _ASKED_ATTEMPTS times in all). huggingface_hub's download waits for a 429's
    Retry-After (and 1 s more), but not for a 503's, and its metadata HEAD asks once; the fetch's time box
    still ends a fetch that waits too long."""
    for attempt in range(_ASKED_ATTEMPTS):
        try:
            return call()
        except Exception as exc:
            status, asked = _asked(exc)
            if not asked or attempt == _ASKED_ATTEMPTS - 1:
                raise
            log.warning("the Hub answered HTTP %s and asked to retry after %.0f s: waiting", status, asked)
            time.sleep(asked)
    raise AssertionError("unreachable")


def _asked(exc: BaseException) -> tuple[int, float]:
    """The status of a 429 or 503 behind `exc` (huggingface_hub wraps it in its own errors) and how long its
    Retry-After asks to wait; (status, 0.0) for any other answer."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if response is not None and hasattr(response, "status_code"):
            status = int(response.status_code)
            return status, retry_after_s(response.headers.get("Retry-After", "")) if status in (429, 503) else 0.0
        seen = seen.__cause__ or seen.__context__
    return 0, 0.0


def _bounded_tqdm(limit: int, where: str) -> type:
    """_terminal_tqdm, refusing the download once more than `limit` bytes came (huggingface_hub reports
    each piece it reads, 10 MiB at most, to its bar before writing it)."""

    class _Bounded(_terminal_tqdm()):  # type: ignore[misc]
        def update(self, n: float | None = 1) -> bool | None:
            self.came = getattr(self, "came", 0) + (n or 0)
            if self.came > limit:
                raise BlobSizeMismatch(
                    f"{where} sent over {limit} bytes, more than it may be (the HEAD announced less); refusing it"
                )
            return super().update(n)  # type: ignore[no-any-return]

    return _Bounded


@functools.cache
def _terminal_tqdm() -> type:
    """huggingface_hub's tqdm bars, drawn only on a terminal (as the S3 backend's): in logs they are noise."""
    from huggingface_hub.utils import tqdm

    class _TerminalOnly(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = kwargs.get("disable") or not sys.stderr.isatty()
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    return _TerminalOnly


class _AtCommit:
    """The Hub's listing at one commit: its summaries are the registry's, its entries read at `head`."""

    def __init__(self, hub: HubRegistry, head: str, tags: dict[tuple[str, str], str]):
        self.hub, self.head, self.tags = hub, head, tags

    def _load_summary(self, kind: str) -> ListingSummary | None:
        return self.hub._load_summary(kind)

    def _store_summary(self, summary: ListingSummary) -> None:
        self.hub._store_summary(summary)

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        def read(digest: str) -> Read:
            manifest = self.hub._read_index(index_relpath(kind, digest), self.head)
            return Read(digest, self.tags[(kind, digest)], None if manifest is None else Listed.of(manifest))

        with ThreadPoolExecutor(_LIST_READERS, thread_name_prefix="prebake-hf-ls") as pool:
            yield from pool.map(read, digests)
