"""Bundle payloads: a folder packed as a deterministic, zstd-compressed tar, and unpacked safely.

    payload.tar.zst   every file of the tree, sorted by path, owner 0:0, mtime 0, mode 0644 or 0755

The same tree always gives the same bytes and so the same sha256 (bundle/pack.py). Unpacking
(bundle/unpack.py) holds every member to the manifest and goes into a temporary sibling folder,
renamed into place only after every file matched; anything else is refused, leaving nothing.
This module is the one door to both: pack, unpack and file_digest.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from prebake.artifacts.bundle.manifest import FileEntry
from prebake.artifacts.bundle.unpack import UnpackLimits, unpack_file
from prebake.artifacts.fsutil import file_digest

if TYPE_CHECKING:
    from prebake.artifacts.bundle.pack import Packed

__all__ = ["UnpackLimits", "file_digest", "pack", "unpack"]


def pack(tree: Path, dest: Path, *, level: int = 3, threads: int | None = None) -> Packed:
    """Pack `tree` into `dest` (.tar.zst) deterministically (artifacts/bundle/pack.py). The packer is
    imported here, on first use: a command that only installs and serves bundles loads none of it."""
    from prebake.artifacts.bundle import pack as packer

    return packer.pack(tree, dest, level=level, threads=threads)


def unpack(
    blob: Path,
    dest: Path,
    files: tuple[FileEntry, ...],
    *,
    limits: UnpackLimits = UnpackLimits(),
) -> Path:
    """Unpack `blob` into `dest` (which must not exist), checking every entry against `files`
    before writing it (artifacts/bundle/unpack.py); nothing is left behind on failure."""
    return unpack_file(Path(blob), Path(dest), files, limits)
