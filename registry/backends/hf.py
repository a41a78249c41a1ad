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

import functools
import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.layout import blob_relpath, index_relpath, side_folder_relpath
from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    RegistryError,
    RegistryNotFound,
    RegistryReadOnly,
    RegistryUnavailable,
)
from prebake.artifacts.ports.objects import Stored
from prebake.artifacts.ports.registry import Published
from prebake.registry.backends.file import FolderStore
from prebake.registry.shared.faults import Answer, Hints, translate
from prebake.registry.shared.http import Bound, as_asked, ticking
from prebake.registry.shared.index import StoreRegistry
from prebake.registry.shared.memory import MemoryStore
from prebake.registry.shared.transfer import copy_verified, missing

log = logging.getLogger(__name__)

T = TypeVar("T")
_DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_ADDRESS = re.compile(r"^hf://(?:(datasets|models)/)?([\w.-]+/[\w.-]+)(?:@([^@\s]+))?/?$")
_COMMIT_ATTEMPTS = 5  # heads moved by other keys' publishes before we give up
_ASKED = 3  # a read the Hub answers 429 or 503 with Retry-After is asked this often in all
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
        cached = ticking(lambda: hub.download(key, hub.revision, limit=size), tee)
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
            cached = hub.download(key, hub.revision, force=True, limit=size)
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
        self._token = env.get("HF_TOKEN") or None  # None: huggingface_hub's saved login, if any
        self._cache_dir = str(cache_dir) if cache_dir else (env.get("HF_HUB_CACHE") or None)
        from huggingface_hub import HfApi

        self._api = HfApi(endpoint=self.endpoint, token=self._token)

    def read_only_why(self) -> str:
        return "HF_HUB_OFFLINE=1 is set; unset it" if self.offline else "it is pinned to a commit; name a branch"

    # -- the port ----------------------------------------------------------------------------

    def head(self, key: str) -> Stored | None:
        if self.offline:
            got = self._cached_download(key, self.revision, local_only=True)
            return None if got is None else Stored(key, got.stat().st_size, "")
        meta = self._present(key, self.revision)
        return None if meta is None else Stored(key, meta[0] if meta[0] is not None else -1, meta[1])

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        got = self.download(key, self.revision, limit=limit, exact=False)
        return None if got is None else (fsutil.read_bounded(got[0].resolve(), limit), got[1])

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        got = self.download(key, self.revision)
        if got is None:
            raise RegistryError(f"{self._where(key)} is gone; run `prebake verify`")
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
        there = [k for k in keys if head is not None and self._present(k, head) is not None]
        if there:
            deletes = [CommitOperationDelete(path_in_repo=k) for k in there]
            self._commit_on_head(deletes, f"prebake: remove {there[0]}", present=there[0])

    def move(self, key: str, dest: str) -> bool:
        """One commit adding the copy and deleting the original (the history keeps every byte)."""
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        got = self.download(key, self.revision, force=True)
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
            yield from self._list_cached(folder, prefix)
            return
        head = self.branch_head(create=False)
        if head is None:
            return
        with self._faults(f"list {self.url}/{folder}"):
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

    # -- reading -----------------------------------------------------------------------------

    def download(
        self, key: str, revision: str, *, force: bool = False, limit: int | None = None, exact: bool = True
    ) -> tuple[Path, str] | None:
        """The cached file for `key` at `revision` and its tag; None if the repo, revision or file is absent.
        One HEAD without retries first (hf_hub_download alone retries an unreachable Hub for about 20 s);
        if the Hub is unreachable, an earlier cached copy serves (entries and blobs are never replaced)."""
        if self.offline:
            cached = self._cached_download(key, revision, local_only=True)
            return None if cached is None else (cached, "")
        try:
            meta = self._present(key, revision)
            if meta is None:
                return None
            announced, tag = meta
            if limit is not None and announced is not None and (announced > limit or (exact and announced != limit)):
                raise BlobDigestMismatch(
                    f"{self._where(key)} is {announced} bytes by the Hub's account, but it may be "
                    f"{'at most ' if not exact else ''}{limit}; refusing to download it: run "
                    f"`prebake verify --quarantine --registry {self.url}`"
                )
        except RegistryUnavailable:
            cached = None if force else self._cached_download(key, revision, local_only=True)
            if cached is None:
                raise
            log.warning("the Hub at %s is unreachable; using the cached %s", self.endpoint, self._where(key))
            return cached, ""
        got = self._cached_download(key, revision, local_only=False, force=force, limit=limit)
        return None if got is None else (got, tag)

    def _present(self, key: str, revision: str) -> tuple[int | None, str] | None:
        """(size at `revision`, None if the Hub does not say; ETag), None if absent: one HEAD, no retries."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import (
            GatedRepoError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        url = hf_hub_url(self.repo_id, key, repo_type=self.repo_type, revision=revision, endpoint=self.endpoint)
        with self._faults(f"read {self._where(key)}"):
            try:
                meta = as_asked(
                    lambda: get_hf_file_metadata(url, token=self._token, endpoint=self.endpoint), attempts=_ASKED
                )
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except (RemoteEntryNotFoundError, RevisionNotFoundError):
                return None
            except RepositoryNotFoundError:
                if self.must_exist:
                    raise RegistryNotFound(self._not_found()) from None
                log.info("%s does not exist at %s, or HF_TOKEN may not read it: a miss", self.url, self.endpoint)
                return None
        return (meta.size if isinstance(meta.size, int) else None), meta.etag or ""

    def _cached_download(
        self, key: str, revision: str, *, local_only: bool, force: bool = False, limit: int | None = None
    ) -> Path | None:
        """hf_hub_download into the cache; None if absent there (local_only) or on the Hub. A body that runs
        past `limit` is refused while it comes (huggingface_hub itself compares sizes only at the end)."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        with self._faults(f"download {self._where(key)}"):
            try:
                local = as_asked(
                    lambda: hf_hub_download(
                        self.repo_id,
                        key,
                        repo_type=self.repo_type,
                        revision=revision,
                        endpoint=self.endpoint,
                        token=self._token,
                        cache_dir=self._cache_dir,
                        local_files_only=local_only,
                        force_download=force,
                        tqdm_class=_terminal_tqdm() if limit is None else _bounded_tqdm(limit, self._where(key)),
                    ),
                    attempts=_ASKED,
                )
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except LocalEntryNotFoundError as exc:
                if local_only:
                    return None
                raise RegistryUnavailable(
                    f"cannot download {self._where(key)}: the Hub at {self.endpoint} stopped answering and "
                    f"the file is not cached ({exc.__cause__ or exc}); check the network and HF_ENDPOINT, or set "
                    f"HF_HUB_OFFLINE=1 to work from the cache"
                ) from exc
            except (RemoteEntryNotFoundError, RevisionNotFoundError, RepositoryNotFoundError):
                return None  # deleted between our HEAD and the download
        return Path(local)

    def _list_cached(self, folder: str, prefix: str) -> Iterator[Stored]:
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
        for path in sorted(snapshot.glob(f"{folder}/**/*")):
            key = path.relative_to(snapshot).as_posix()
            if key.startswith(prefix) and path.is_file():  # cache entries are links into the cache's blobs/
                yield Stored(key, path.stat().st_size, "")

    # -- writing ---------------------------------------------------------------------------

    def branch_head(self, *, create: bool) -> str | None:
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
            if absent is not None and self._present(absent, head) is not None:
                return False
            if present is not None and self._present(present, head) is None:
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

        with self._faults(f"commit to {self.url} ({message})"):
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

    def _where(self, key: str) -> str:
        return f"{self.url}/{key}"

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
            answer = Answer(
                status,
                detail=str(exc),
                refused=isinstance(exc, GatedRepoError),
                missing=isinstance(exc, RepositoryNotFoundError),
            )
            raise translate(answer, doing, self._hints) from exc
        except OSError as exc:
            if "Consistency check failed" not in str(exc):  # huggingface_hub's own size check
                raise
            raise BlobSizeMismatch(
                f"cannot {doing}: the Hub sent a body of another size than it announced ({exc}); the blob is "
                f"refused; run `prebake verify --deep --registry {self.url}`"
            ) from exc

    @property
    def _hints(self) -> Hints:
        return Hints(
            who=f"the Hub at {self.endpoint}",
            refused=f"set HF_TOKEN to a token that may read {self.repo_id} (and write to it, to publish)",
            missing=self._not_found(),
        )

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


def _bounded_tqdm(limit: int, where: str) -> type:
    """_terminal_tqdm, refusing the download past `limit` bytes (huggingface_hub reports each piece to
    its bar before writing it)."""

    class _Bounded(_terminal_tqdm()):  # type: ignore[misc]
        def update(self, n: float | None = 1) -> bool | None:
            if not hasattr(self, "bound"):
                self.bound = Bound(limit, where, error=BlobSizeMismatch)
            self.bound.add(int(n or 0))
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
