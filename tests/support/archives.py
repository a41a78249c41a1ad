"""Hand-built .tar.zst archives, entry by entry, for tests of what unpacking refuses."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import zstandard

Entry = tuple[tarfile.TarInfo, "bytes | None"]


def archive(path: Path, *entries: Entry) -> Path:
    """A .tar.zst at `path` holding exactly `entries`, in order."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    path.write_bytes(zstandard.ZstdCompressor().compress(raw.getvalue()))
    return path


def file(name: str, data: bytes = b"x") -> Entry:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def link(name: str, target: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, None


def folder(name: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info, None
