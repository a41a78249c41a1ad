"""The Hugging Face Hub backend: StoreRegistry (registry/shared/index.py) over HubStore, one repo at one revision.

    hf://[datasets/]<namespace>/<repo>[@revision]   revision: a branch (default main), or a commit (read-only)

May touch the Hub through huggingface_hub (HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE, HF_HUB_CACHE, read
when opened: the library freezes some at import) and its cache; HTTP care is registry/shared/http.py.
Reads go through the cache: one HEAD without retries first, so an unreachable Hub fails at once
and what is cached still serves; offline, only the cache answers and publishing is refused.
A write is a commit: the Hub has no If-None-Match, so a create-only write is a commit on the head it
read, with parent_commit, looked at again when the Hub answers 412 (publish: blob and entry in one
commit, Batching; quarantine: one commit, Movable). Listing summaries stay on this machine
(<home>/listing/hf-<digest>/summary/; no home: in memory). The repo is created private on first write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.layout import blob_relpath, index_relpath, side_folder_relpath
from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    RegistryError,
    RegistryNotFound,
    RegistryReadOnly,
    RegistryUnavailable,
)
from prebake.artifacts.ports.objects import Stored
from prebake.artifacts.ports.registry import Published
from prebake.registry.backends.file import FolderStore
from prebake.registry.backends.hf_cache import HubRepo
from prebake.registry.shared.http import ticking
from prebake.registry.shared.index import StoreRegistry
from prebake.registry.shared.memory import MemoryStore
from prebake.registry.shared.transfer import copy_verified, missing

log = logging.getLogger(__name__)

T = TypeVar("T")
_DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_ADDRESS = re.compile(r"^hf://(?:(datasets|models)/)?([\w.-]+/[\w.-]+)(?:@([^@\s]+))?/?$")
_COMMIT_ATTEMPTS = 5  # heads moved by other keys' publishes before we give up
_CHUNK = 1 << 20


class HubRegistry(StoreRegistry):
    """index/ + blobs/ inside a Hub repo: StoreRegistry over HubStore, its summaries on this machine."""

    def __init__(
        self,
        address: str,
        *,
        cache_dir: Path | str | None = None,
        must_exist: bool = False,
        listing_dir: Path | None = None,
    ):
        self.hub = HubStore(address, cache_dir=cache_dir, must_exist=must_exist)
        self.repo_type, self.repo_id, self.revision = self.hub.repo_type, self.hub.repo_id, self.hub.revision
        self.endpoint = self.hub.endpoint
        repo = hashlib.sha256(f"{self.hub.endpoint}\n{self.hub.repo_type}\n{self.hub.repo_id}".encode()).hexdigest()
        summaries = MemoryStore() if listing_dir is None else FolderStore(Path(listing_dir) / f"hf-{repo[:24]}")
        super().__init__(self.hub, summaries=summaries)

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        """Into huggingface_hub's cache (the announced size checked first), verified there, then copied
        to `dest` through `tee`: the consumer is only ever fed a copy that already matched."""
        hub, key, dest = self.hub, blob_relpath(digest), Path(dest)
        where = self._where(key)
        cached = ticking(lambda: hub.repo.download(key, hub.revision, limit=size), tee)
        if cached is None:
            if hub.offline:
                raise RegistryUnavailable(
                    f"{where} is not in the Hugging Face cache and HF_HUB_OFFLINE=1; fetch it once online"
                )
            raise missing(digest, where, self.url)
        try:
            copy_verified(cached[0], dest, digest, where=where, registry_url=self.url, size=size)
        except BlobDigestMismatch:
            if hub.offline:
                raise
            log.warning("cached copy of %s is corrupt; downloading it again", where)  # the Hub's copy decides
            cached = hub.repo.download(key, hub.revision, force=True, limit=size)
            if cached is None:
                raise RegistryError(f"blob {digest} vanished from {where} while being fetched; retry") from None
            copy_verified(cached[0], dest, digest, where=where, registry_url=self.url, size=size)
        if tee is not None:  # verified: now stream the very same bytes to the consumer
            copy_verified(cached[0], dest, digest, where=where, registry_url=self.url, size=size, tee=tee)
        return dest

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        if not self.writable:
            raise RegistryReadOnly(f"cannot publish to {self.url}: {self.hub.read_only_why()} to publish")
        self.hub.branch_head(create=True)  # the Hub answers (else no cached entry may settle it) and the repo exists
        return super().publish(manifest, blob)

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """One commit deleting the index entry and (if given) its blob and every file beside it."""
        keys = [index_relpath(kind, key_digest)]
        if blob_digest is not None:
            keys += [blob_relpath(blob_digest), *(s.key for s in self.hub.list(side_folder_relpath(blob_digest) + "/"))]
        self.hub.delete_many(keys)

    def __repr__(self) -> str:
        return f"HubRegistry({self.url!r}, endpoint={self.hub.endpoint!r})"


class HubStore:
    """The object-store port over a Hub repo at one revision, through huggingface_hub (Batching, Movable)."""

    def __init__(self, address: str, *, cache_dir: Path | str | None = None, must_exist: bool = False):
        self.repo_type, self.repo_id, self.revision = _parse_address(address)
        self.must_exist = must_exist  # a repo that is not there: RegistryNotFound, not a miss (read-only commands)
        self.url = f"hf://{'datasets/' if self.repo_type == 'dataset' else ''}{self.repo_id}@{self.revision}"
        env = os.environ
        self.endpoint = (env.get("HF_ENDPOINT") or _DEFAULT_ENDPOINT).rstrip("/")
        self.offline = env.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
        self.writable = not self.offline and not _COMMIT_SHA.match(self.revision)
        token = env.get("HF_TOKEN") or None  # None: huggingface_hub's saved login, if any
        cache = str(cache_dir) if cache_dir else (env.get("HF_HUB_CACHE") or None)
        self.repo = HubRepo(
            self.repo_type, self.repo_id, self.revision, self.url, self.endpoint, self.offline, token, cache, must_exist
        )
        from huggingface_hub import HfApi

        self._api = HfApi(endpoint=self.endpoint, token=token)

    def read_only_why(self) -> str:
        return "HF_HUB_OFFLINE=1 is set; unset it" if self.offline else "it is pinned to a commit; name a branch"

    # -- the port ----------------------------------------------------------------------------

    def head(self, key: str) -> Stored | None:
        if self.offline:
            got = self.repo.cached_download(key, self.revision, local_only=True)
            return None if got is None else Stored(key, got.stat().st_size, "")
        meta = self.repo.present(key, self.revision)
        return None if meta is None else Stored(key, meta[0] if meta[0] is not None else -1, meta[1])

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        got = self.repo.download(key, self.revision, limit=limit, exact=False)
        return None if got is None else (fsutil.read_bounded(got[0].resolve(), limit), got[1])

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        got = self.repo.download(key, self.revision)
        if got is None:
            raise RegistryError(f"{self.repo.where(key)} is gone; run `prebake verify`")
        with got[0].resolve().open("rb") as f:
            f.seek(first)
            left = None if last is None else last - first + 1
            while chunk := f.read(_CHUNK if left is None else min(_CHUNK, left)):  # read(0) ends a range
                left = None if left is None else left - len(chunk)
                yield chunk

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        return self.put_many([(key, data)], unless=key if create_only else None)

    def put_many(self, objects: Sequence[tuple[str, bytes | Path]], *, unless: str | None) -> bool:
        """One commit of every object on top of the head it read, unless `unless` is at that head."""
        from huggingface_hub import CommitOperationAdd

        adds = [
            CommitOperationAdd(path_in_repo=k, path_or_fileobj=str(d) if isinstance(d, Path) else d) for k, d in objects
        ]
        return self._commit_on_head(adds, f"prebake: add {objects[-1][0]}", absent=unless)

    def delete(self, key: str) -> None:
        self.delete_many([key])

    def delete_many(self, keys: Sequence[str]) -> None:
        """One commit removing those of `keys` the head has (the history keeps the bytes)."""
        from huggingface_hub import CommitOperationDelete

        head = self.branch_head(create=False)
        there = [k for k in keys if head is not None and self.repo.present(k, head) is not None]
        if there:
            deletes = [CommitOperationDelete(path_in_repo=k) for k in there]
            self._commit_on_head(deletes, f"prebake: remove {there[0]}", present=there[0])

    def move(self, key: str, dest: str) -> bool:
        """One commit adding the copy and deleting the original (the history keeps every byte)."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        got = self.repo.download(key, self.revision, force=True)
        if got is None:
            return False
        operations = [
            CommitOperationAdd(path_in_repo=dest, path_or_fileobj=str(got[0])),
            CommitOperationDelete(path_in_repo=key),
        ]
        return self._commit_on_head(operations, f"prebake verify: quarantine {key}", present=key)

    def list(self, prefix: str) -> Iterator[Stored]:
        """One tree listing at the head (tags: git blob ids); offline, what the cache holds."""
        from huggingface_hub import RepoFile
        from huggingface_hub.errors import RemoteEntryNotFoundError

        folder = prefix.rstrip("/")
        if self.offline:
            yield from self.repo.list_cached(folder, prefix)
            return
        head = self.branch_head(create=False)
        if head is None:
            return
        with self.repo.faults(f"list {self.url}/{folder}"):
            try:
                entries = list(
                    self._api.list_repo_tree(
                        self.repo_id, path_in_repo=folder, recursive=True, repo_type=self.repo_type, revision=head
                    )
                )
            except RemoteEntryNotFoundError:
                return
        files = [e for e in entries if isinstance(e, RepoFile) and e.path.startswith(prefix)]
        yield from sorted((Stored(e.path, e.size, e.blob_id) for e in files), key=lambda s: s.key)

    # -- writing ---------------------------------------------------------------------------

    def branch_head(self, *, create: bool) -> str | None:
        """The commit sha the revision points at; None if the repo is absent and not to be created."""
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        with self.repo.faults(f"read the head of {self.url}"):
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
                    raise RegistryNotFound(self.repo.not_found()) from None
                if not create:
                    return None
            self._api.create_repo(self.repo_id, repo_type=self.repo_type, private=True, exist_ok=True)
            log.info("created %s at %s", self.url, self.endpoint)
            return self._api.repo_info(self.repo_id, repo_type=self.repo_type, revision=self.revision).sha

    def _commit_on_head(
        self, operations: Sequence[Any], message: str, *, absent: str | None = None, present: str | None = None
    ) -> bool:
        """One commit of `operations` on top of the branch's head, looked at again while the branch
        moves under it; False, committing nothing, when `absent` is at the head or `present` is not."""
        if not self.writable:
            raise RegistryReadOnly(f"cannot write to {self.url}: {self.read_only_why()}")
        for _ in range(_COMMIT_ATTEMPTS):
            head = self.branch_head(create=absent is not None or present is None)
            if head is None:
                return False
            if absent is not None and self.repo.present(absent, head) is not None:
                return False
            if present is not None and self.repo.present(present, head) is None:
                return False
            if self._commit(operations, head, message):
                return True
        raise RegistryUnavailable(
            f"cannot write to {self.url}: branch {self.revision} moved under each of {_COMMIT_ATTEMPTS} "
            f"attempts (other writers); retry when the repo is quieter"
        )

    def _commit(self, operations: Sequence[Any], head: str, message: str) -> bool:
        """One commit of `operations` on top of `head`; False if the branch moved since (look again)."""
        from huggingface_hub.errors import HfHubHTTPError

        with self.repo.faults(f"commit to {self.url} ({message})"):
            try:
                self._api.create_commit(
                    self.repo_id,
                    operations,
                    commit_message=message,
                    repo_type=self.repo_type,
                    revision=self.revision,
                    parent_commit=head,
                )
            except HfHubHTTPError as exc:
                if exc.response is not None and exc.response.status_code in (409, 412):
                    return False  # someone committed since we read the head
                raise
        return True


def _parse_address(address: str) -> tuple[str, str, str]:
    """(repo type, repo id, revision) of hf://[datasets/]<namespace>/<repo>[@revision]."""
    m = _ADDRESS.match(address)
    if not m:
        raise RegistryError(
            f"{address!r} is not a Hub address; write hf://<namespace>/<repo>[@revision] "
            f"or hf://datasets/<namespace>/<repo>[@revision]"
        )
    return ("dataset" if m.group(1) == "datasets" else "model"), m.group(2), m.group(3) or "main"
