"""Bundle payloads: a folder packed as a deterministic, zstd-compressed tar, and unpacked safely.

    payload.tar.zst
    └── every file of the tree, sorted by path, owner 0:0, mtime 0, mode 0644 or 0755

The same tree always gives the same bytes and so the same sha256 (zstd runs with at
least one worker thread, in which mode its output does not depend on the number of
threads). Unpacking (artifacts/unpack.py) holds every member to the manifest before
writing it and goes into a temporary sibling folder that is renamed into place only
after every file matched: a name the manifest lacks, a wrong type or size, a device
file, or an archive that decompresses past what the manifest declares is refused, and
nothing is left behind.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import zstandard

from .errors import BundleError, UnsafeArchiveError
from .manifest import BlobRef, FileEntry
from .unpack import UnpackLimits, unpack_file

__all__ = ["Packed", "UnpackLimits", "file_digest", "pack", "unpack"]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Packed:
    blob: BlobRef
    files: tuple[FileEntry, ...]


def pack(tree: Path, dest: Path, *, level: int = 3, threads: int | None = None) -> Packed:
    """Pack `tree` into `dest` (.tar.zst) deterministically; return the blob digest and file list."""
    tree = Path(tree)
    if not tree.is_dir():
        raise BundleError(f"cannot pack {tree}: it is not a folder")
    workers = max(1, threads if threads is not None else (os.cpu_count() or 1))
    compressor = zstandard.ZstdCompressor(level=level, threads=workers)
    files: list[FileEntry] = []
    hasher = _HashingWriter(dest.open("wb"))
    with hasher, compressor.stream_writer(hasher, closefd=False, write_size=_CHUNK) as zw:
        with tarfile.open(fileobj=zw, mode="w|", format=tarfile.GNU_FORMAT, bufsize=_CHUNK) as tar:
            tar.copybufsize = _CHUNK  # tarfile copies in 16 KiB pieces by default: far too small here
            for rel, path in _walk(tree):
                files.append(_add(tar, rel, path))
    return Packed(blob=BlobRef(digest="sha256:" + hasher.hexdigest(), size=hasher.size), files=tuple(files))


def unpack(
    blob: Path,
    dest: Path,
    files: tuple[FileEntry, ...],
    *,
    limits: UnpackLimits = UnpackLimits(),
) -> Path:
    """Unpack `blob` into `dest` (which must not exist), checking every entry against `files`
    before writing it (artifacts/unpack.py); nothing is left behind on failure."""
    return unpack_file(Path(blob), Path(dest), files, limits)


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


# -- packing ---------------------------------------------------------------------------------


def _walk(tree: Path) -> Iterator[tuple[str, Path]]:
    """Every file and link under tree, as (posix relative path, path), sorted by relative path."""
    found = []
    for root, dirs, names in os.walk(tree):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            found.append((path.relative_to(tree).as_posix(), path))
    return iter(sorted(found))


def _add(tar: tarfile.TarFile, rel: str, path: Path) -> FileEntry:
    st = path.lstat()
    info = tarfile.TarInfo(rel)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        _check_link(rel, target)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        tar.addfile(info)
        return FileEntry(path=rel, size=0, sha256="sha256:" + hashlib.sha256(target.encode()).hexdigest(), link=target)
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"cannot pack {path}: only regular files and links can go into a bundle")
    executable = bool(st.st_mode & 0o111)
    info.size, info.mode = st.st_size, 0o755 if executable else 0o644
    with path.open("rb") as f:
        reader = _HashingReader(f)
        tar.addfile(info, reader)
    if reader.size != st.st_size:
        raise BundleError(f"{path} changed size while it was being packed; pack a tree nobody writes to")
    return FileEntry(path=rel, size=st.st_size, sha256="sha256:" + reader.hexdigest(), executable=executable)


def _check_link(rel: str, target: str, blob: Path | None = None) -> None:
    where = f"{blob} holds" if blob else "the tree holds"
    resolved = PurePosixPath(rel).parent / target
    depth = 0
    for part in resolved.parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            break
    if os.path.isabs(target) or depth < 0:
        raise UnsafeArchiveError(f"{where} a link {rel!r} -> {target!r} that leaves its folder; refusing it")


class _HashingWriter:
    """A binary sink that hashes and counts what passes through it."""

    def __init__(self, f):
        self._f, self._h, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self._h.update(data)
        self.size += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


class _HashingReader:
    """A binary source that hashes and counts what is read from it."""

    def __init__(self, f):
        self._f, self._h, self.size = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self._h.update(data)
        self.size += len(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()
