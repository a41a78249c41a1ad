"""An object store in a dict, for this process only: where a registry opened without a home keeps
what it would otherwise keep on this machine (the Hub's listing summaries). Touches nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from prebake.artifacts.ports.objects import Stored


class MemoryStore:
    """The object-store port (prebake.artifacts.ports.objects) over a dict."""

    writable = True

    def __init__(self) -> None:
        self.url, self._objects = "memory:", dict[str, bytes]()

    def head(self, key: str) -> Stored | None:
        data = self._objects.get(key)
        return None if data is None else Stored(key, len(data), "")

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        data = self._objects.get(key)
        return None if data is None else (data[:limit], "")

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        yield self._objects[key][first : None if last is None else last + 1]

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        if create_only and key in self._objects:
            return False
        self._objects[key] = data if isinstance(data, bytes) else Path(data).read_bytes()
        return True

    def delete(self, key: str) -> None:
        self._objects.pop(key, None)

    def list(self, prefix: str) -> Iterator[Stored]:
        for key in sorted(k for k in self._objects if k.startswith(prefix)):
            yield Stored(key, len(self._objects[key]), "")


__all__ = ["MemoryStore"]
