"""What S3Registry's listing and maintenance mixins use of the registry, declared once and typed.

S3Registry (registry/backends/s3.py) defines every member below; the mixins (s3_listing.py, s3_maintain.py)
inherit these declarations, so mypy checks their use of the registry without seeing s3.py.
"""

from __future__ import annotations

from abc import abstractmethod
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Transfers(Protocol):
    """The part of S3Settings the mixins read."""

    @property
    def concurrency(self) -> int: ...


class S3Parts:
    """Declared here, defined by S3Registry."""

    bucket: str
    url: str
    settings: Transfers
    _client: Any  # a boto3 S3 client
    _transfer: Any  # its boto3 TransferConfig

    @abstractmethod
    def _key(self, relpath: str) -> str:
        """The object key of a path relative to the registry's prefix."""

    @abstractmethod
    def _where(self, key: str) -> str:
        """An object key as the s3:// address messages name."""

    @abstractmethod
    def _faults(self, doing: str) -> AbstractContextManager[None]:
        """boto's exceptions as registry errors that say what `doing` failed and the fix."""

    @abstractmethod
    def _get_or_none(self, key: str) -> bytes | None: ...

    @abstractmethod
    def _get_tagged(self, key: str) -> tuple[bytes, str] | None: ...

    @abstractmethod
    def _size_or_none(self, key: str) -> int | None: ...


__all__ = ["S3Parts", "Transfers"]
