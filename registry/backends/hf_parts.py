"""What HubRegistry's listing and maintenance mixins use of the registry, declared once and typed.

HubRegistry (registry/backends/hf.py) defines every member below; the mixins (hf_listing.py,
hf_maintain.py) inherit these declarations, so mypy checks their use of the registry without
seeing hf.py.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.ports.listing import ListingSummary

if TYPE_CHECKING:  # huggingface_hub is imported only when a Hub registry is opened
    from huggingface_hub import HfApi


class HubParts:
    """Declared here, defined by HubRegistry."""

    url: str
    endpoint: str
    repo_type: str
    repo_id: str
    revision: str
    offline: bool
    listing_dir: Path | None  # where this machine keeps the listing summaries; None: in memory
    _summaries: dict[str, ListingSummary]
    _api: HfApi

    @abstractmethod
    def list(self, kind: str | None = None) -> Iterator[Manifest]: ...

    @abstractmethod
    def _head(self, *, create: bool) -> str | None:
        """The commit the revision points at; None if the repo or revision is absent."""

    @abstractmethod
    def _index_files(self, folder: str, head: str) -> Sequence[tuple[str, str]]: ...

    @abstractmethod
    def _read_index(self, relpath: str, revision: str) -> Manifest | None: ...

    @abstractmethod
    def _download(
        self, relpath: str, revision: str, *, force: bool = False, limit: int | None = None, exact: bool = True
    ) -> Path | None: ...

    @abstractmethod
    def _present(self, relpath: str, revision: str) -> int | bool | None: ...

    @abstractmethod
    def _where(self, relpath: str) -> str: ...

    @abstractmethod
    def _faults(self, doing: str) -> AbstractContextManager[None]: ...
