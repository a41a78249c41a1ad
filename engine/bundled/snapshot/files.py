"""The files a snapshot's process maps or holds open, and whether this host has the same ones.

CRIU's image holds the process's anonymous memory; what the process mapped from files (the
interpreter, shared libraries, the venv's extension modules, AOTInductor packages, weights read by
mmap) and the files it holds open are opened again at their paths on restore. So a restore is only
as right as those files: the bake records each one's path, size, sha256 and mode (`FileSet`), and a host
whose file differs (or lacks it) is refused with the file named, before CRIU runs.

Hashing libtorch on every start would cost a second, so digests are cached by (path, size, mtime,
inode, ctime) in a small JSON file under the store's home, as git's index caches by stat.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_SKIPPED_PREFIXES = ("/dev/", "/proc/", "/sys/", "/memfd:", "/SYSV", "anon_inode:")


@dataclass(frozen=True)
class FileRecord:
    path: str
    size: int
    sha256: str
    mode: int  # its permission bits: CRIU refuses a mapped file whose mode is not the dumped one


@dataclass(frozen=True)
class Differs:
    """The first file this host lacks or has otherwise, and how."""

    path: str
    why: str

    def explain(self) -> str:
        return f"{self.path} {self.why}"


def mapped_files(pid: int) -> list[str]:
    """The regular files process `pid` maps (every thread shares the maps) or holds open, sorted."""
    paths: set[str] = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and not parts[5].endswith("(deleted)"):
            paths.add(parts[5])
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/"):
            paths.add(target)
    return sorted(p for p in paths if not p.startswith(_SKIPPED_PREFIXES) and os.path.isfile(p))


def deleted_mappings(pid: int) -> list[str]:
    """Files the process maps that were deleted since: CRIU would have to copy them into the image."""
    found = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5].endswith("(deleted)"):
            found.add(parts[5].removesuffix(" (deleted)"))
    return sorted(found)


class DigestCache:
    """sha256 of files, cached by their stat; one JSON file, written atomically."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._entries: dict[str, list] = json.loads(path.read_text())
        except (OSError, ValueError):
            self._entries = {}
        self._changed = False

    def digest(self, path: str) -> str:
        st = os.stat(path)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        cached = self._entries.get(path)
        if cached is not None and cached[:4] == stamp:
            return str(cached[4])
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        self._entries[path] = [*stamp, h.hexdigest()]
        self._changed = True
        return h.hexdigest()

    def save(self) -> None:
        if not self._changed:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(self._entries))
        os.replace(temp, self.path)
        self._changed = False


def record(paths: Iterable[str], cache: DigestCache) -> list[FileRecord]:
    """Each file's path, size, digest and permission bits, as the bake writes them into the snapshot's tree."""
    records = [FileRecord(p, os.path.getsize(p), cache.digest(p), stat.S_IMODE(os.stat(p).st_mode)) for p in paths]
    cache.save()
    return records


def first_difference(records: Iterable[FileRecord], cache: DigestCache) -> Differs | None:
    """The first recorded file this host lacks or holds with other bytes; None when all match."""
    try:
        for r in records:
            try:
                size = os.path.getsize(r.path)
            except OSError:
                return Differs(r.path, "is missing on this host")
            if size != r.size:
                return Differs(r.path, f"is {size} bytes here, {r.size} at the bake")
            if cache.digest(r.path) != r.sha256:
                return Differs(
                    r.path, f"has other bytes here (sha256 {cache.digest(r.path)[:12]}, {r.sha256[:12]} at the bake)"
                )
        return None
    finally:
        cache.save()
