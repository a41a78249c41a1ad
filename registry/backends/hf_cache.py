"""Reading a Hub repo through huggingface_hub's cache, and the Hub's errors as registry errors.

`HubRepo` is the repo an hf:// address names (type, id, revision, the endpoint and token of this
process) and how it is read: one HEAD without retries before a download, the download into the
cache (bounded by the size the manifest says), the cache alone when offline or when the Hub is
unreachable, and every error translated by registry/shared/faults.py's rule with the Hub's hints.
HubStore (registry/backends/hf.py) writes through commits and reads through this.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prebake.artifacts.ports.errors import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    RegistryNotFound,
    RegistryUnavailable,
)
from prebake.artifacts.ports.objects import Stored
from prebake.registry.shared.faults import Answer, Hints, translate
from prebake.registry.shared.http import Bound, as_asked

log = logging.getLogger(__name__)

_ASKED = 3  # a read the Hub answers 429 or 503 with Retry-After is asked this often in all


@dataclass(frozen=True)
class HubRepo:
    """One Hub repo at one revision, as this process reaches it, and its reads through the cache."""

    repo_type: str  # "model" or "dataset"
    repo_id: str
    revision: str
    url: str  # hf://[datasets/]ns/repo@revision
    endpoint: str
    offline: bool  # HF_HUB_OFFLINE: only what the cache holds
    token: str | None  # None: huggingface_hub's saved login, if any
    cache_dir: str | None
    must_exist: bool  # a repo that is not there: RegistryNotFound, not a miss (read-only commands)

    def download(
        self, key: str, revision: str, *, force: bool = False, limit: int | None = None, exact: bool = True
    ) -> tuple[Path, str] | None:
        """The cached file for `key` at `revision` and its tag; None if the repo, revision or file is absent.
        One HEAD without retries first (hf_hub_download alone retries an unreachable Hub for about 20 s);
        if the Hub is unreachable, an earlier cached copy serves (entries and blobs are never replaced)."""
        if self.offline:
            cached = self.cached_download(key, revision, local_only=True)
            return None if cached is None else (cached, "")
        try:
            meta = self.present(key, revision)
            if meta is None:
                return None
            announced, tag = meta
            if limit is not None and announced is not None and (announced > limit or (exact and announced != limit)):
                raise BlobDigestMismatch(
                    f"{self.where(key)} is {announced} bytes by the Hub's account, but it may be "
                    f"{'at most ' if not exact else ''}{limit}; refusing to download it: run "
                    f"`prebake verify --quarantine --registry {self.url}`"
                )
        except RegistryUnavailable:
            cached = None if force else self.cached_download(key, revision, local_only=True)
            if cached is None:
                raise
            log.warning("the Hub at %s is unreachable; using the cached %s", self.endpoint, self.where(key))
            return cached, ""
        got = self.cached_download(key, revision, local_only=False, force=force, limit=limit)
        return None if got is None else (got, tag)

    def present(self, key: str, revision: str) -> tuple[int | None, str] | None:
        """(size at `revision`, None if the Hub does not say; ETag), None if absent: one HEAD, no retries."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import (
            GatedRepoError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        url = hf_hub_url(self.repo_id, key, repo_type=self.repo_type, revision=revision, endpoint=self.endpoint)
        with self.faults(f"read {self.where(key)}"):
            try:
                meta = as_asked(
                    lambda: get_hf_file_metadata(url, token=self.token, endpoint=self.endpoint), attempts=_ASKED
                )
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except (RemoteEntryNotFoundError, RevisionNotFoundError):
                return None
            except RepositoryNotFoundError:
                if self.must_exist:
                    raise RegistryNotFound(self.not_found()) from None
                log.info("%s does not exist at %s, or HF_TOKEN may not read it: a miss", self.url, self.endpoint)
                return None
        return (meta.size if isinstance(meta.size, int) else None), meta.etag or ""

    def cached_download(
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

        with self.faults(f"download {self.where(key)}"):
            try:
                local = as_asked(
                    lambda: hf_hub_download(
                        self.repo_id,
                        key,
                        repo_type=self.repo_type,
                        revision=revision,
                        endpoint=self.endpoint,
                        token=self.token,
                        cache_dir=self.cache_dir,
                        local_files_only=local_only,
                        force_download=force,
                        tqdm_class=_terminal_tqdm() if limit is None else _bounded_tqdm(limit, self.where(key)),
                    ),
                    attempts=_ASKED,
                )
            except GatedRepoError:
                raise  # access refused, not absent: _faults says what to do
            except LocalEntryNotFoundError as exc:
                if local_only:
                    return None
                raise RegistryUnavailable(
                    f"cannot download {self.where(key)}: the Hub at {self.endpoint} stopped answering and "
                    f"the file is not cached ({exc.__cause__ or exc}); check the network and HF_ENDPOINT, or set "
                    f"HF_HUB_OFFLINE=1 to work from the cache"
                ) from exc
            except (RemoteEntryNotFoundError, RevisionNotFoundError, RepositoryNotFoundError):
                return None  # deleted between our HEAD and the download
        return Path(local)

    def list_cached(self, folder: str, prefix: str) -> Iterator[Stored]:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        try:
            snapshot = Path(
                snapshot_download(
                    self.repo_id,
                    repo_type=self.repo_type,
                    revision=self.revision,
                    cache_dir=self.cache_dir,
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

    def where(self, key: str) -> str:
        return f"{self.url}/{key}"

    @contextmanager
    def faults(self, doing: str) -> Iterator[None]:
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
            raise translate(answer, doing, self.hints) from exc
        except OSError as exc:
            if "Consistency check failed" not in str(exc):  # huggingface_hub's own size check
                raise
            raise BlobSizeMismatch(
                f"cannot {doing}: the Hub sent a body of another size than it announced ({exc}); the blob is "
                f"refused; run `prebake verify --deep --registry {self.url}`"
            ) from exc

    @property
    def hints(self) -> Hints:
        return Hints(
            who=f"the Hub at {self.endpoint}",
            refused=f"set HF_TOKEN to a token that may read {self.repo_id} (and write to it, to publish)",
            missing=self.not_found(),
        )

    def not_found(self) -> str:
        return (
            f"registry {self.url} does not exist at {self.endpoint}, or HF_TOKEN may not read it; fix the "
            f"registry address, or set HF_TOKEN to a token that may read {self.repo_id}"
        )


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
