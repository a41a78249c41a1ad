"""Checked unpacking: a .tar.zst stream written to a folder only as far as its manifest allows.

Each member is held to the manifest before a byte of it is written: its header parsed by our
own tar reader (never tarfile, which reads GNU long names and pax records whole, whatever size
they claim), its name one of the manifest's files not seen before, its type, link target and
size the manifest's; exactly that many bytes go to the writer threads (bundle/unpack_write.py),
which hash and compare; at the end every file of the manifest was there. So bytes, entries and
memory are bounded whatever the archive claims, a decompression bomb stops at its first
oversized member, and nothing is renamed into place unless all passed. docs/performance.md.
"""

from __future__ import annotations

import hashlib
import io
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO

import zstandard

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.download_pipe import Aborted, Feed
from prebake.artifacts.bundle.manifest import MAX_PATH_BYTES, FileEntry
from prebake.artifacts.bundle.tarheader import BLOCK as _BLOCK
from prebake.artifacts.bundle.tarheader import Member, extended, parse_header
from prebake.artifacts.bundle.unpack_write import Folders, Writers
from prebake.artifacts.errors import BundleError, UnsafeArchiveError

_LARGE = 1 << 20  # members over this size (with padding) go to the ordered lane, chunk by chunk
_READ_SIZE = 1 << 20  # what the decompressor reads of the blob at a time
_MAX_EXTENDED = MAX_PATH_BYTES + 8192  # a GNU long name or pax record: a path and some change


@dataclass(frozen=True)
class UnpackLimits:
    """Caps on top of the manifest's own bounds, for a manifest that declares too much."""

    max_bytes: int = 64 << 30
    max_entries: int = 1_000_000
    max_window_log: int = 27  # 128 MiB, zstd's default ceiling for decompression

    def check(self, files: tuple[FileEntry, ...], what: str) -> None:
        """Refuse, before anything is read, a manifest that declares more than the caps allow."""
        total = sum(f.size for f in files)
        if len(files) > self.max_entries:
            raise UnsafeArchiveError(f"{what} declares {len(files)} files, over the cap of {self.max_entries}")
        if total > self.max_bytes:
            raise UnsafeArchiveError(
                f"{what} declares {total} bytes of files, over the cap of {self.max_bytes}; raise "
                f"PREBAKE_UNPACK_MAX_BYTES if the bundle is genuinely that large"
            )


def extract(compressed: BinaryIO, into: Path, files: tuple[FileEntry, ...], limits: UnpackLimits, what: str) -> None:
    """Decompress and unpack `compressed` into the existing empty folder `into`, checking every
    member against `files` before writing it; raise BundleError (or a subclass) on any deviation."""
    read_checked(compressed, lambda reader: _Extraction(reader, into, files, what), files, limits, what)


def read_checked(
    compressed: BinaryIO,
    members: Callable[[io.BufferedReader], CheckedMembers],
    files: tuple[FileEntry, ...],
    limits: UnpackLimits,
    what: str,
) -> None:
    """Decompress `compressed` and hand it to `members(reader)` (a CheckedMembers: what becomes of
    each member once it passed the manifest), with extract's bounds and errors."""
    limits.check(files, what)
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << limits.max_window_log)
    try:
        with dctx.stream_reader(compressed, read_size=_READ_SIZE, closefd=False) as zr:
            members(io.BufferedReader(zr, _READ_SIZE)).run()
    except zstandard.ZstdError as exc:
        if "window" in str(exc).lower() or "memory" in str(exc).lower():
            raise UnsafeArchiveError(
                f"{what} needs a zstd window above 2^{limits.max_window_log} bytes to decompress; refusing it "
                f"(prebake packs with smaller windows: this blob was not made by prebake)"
            ) from exc
        raise BundleError(f"{what} is not a readable .tar.zst ({exc}); the bundle is corrupt") from exc


def unpack_streamed(
    download: Callable[[Callable[[bytes], None]], object],
    dest: Path,
    files: tuple[FileEntry, ...],
    limits: UnpackLimits,
    what: str,
) -> Path:
    """Unpack a blob while it downloads: `download(tee)` must hand every chunk, in order, to `tee`
    and return only once the whole blob matched its digest. The tree is renamed to `dest` after both
    the download and the unpack succeeded; on any failure nothing is left behind. A download error
    (wrong digest or size, a broken connection) is raised over the unpacker's, which is only the
    answer for a blob that matched its digest."""
    limits.check(files, what)
    tmp = _partial(dest)
    feed = Feed()
    with ThreadPoolExecutor(1, thread_name_prefix="prebake-unpack") as pool:
        unpacking = pool.submit(_extract_fed, feed, tmp, files, limits, what)
        try:
            try:
                download(feed.put)
            except BaseException:
                feed.abort()
                raise  # a broken or wrong download is the cause, whatever the unpacker made of its bytes
            feed.close()
            unpacking.result()  # the blob was right: the unpacker's verdict on it is the answer
            fsutil.crash_point("unpack")
            os.replace(tmp, dest)
        except BaseException:
            feed.abort()
            wait([unpacking])  # the extraction stops at its next read; only then is its folder removed
            _remove(tmp)
            raise
    return dest


def unpack_file(blob: Path, dest: Path, files: tuple[FileEntry, ...], limits: UnpackLimits) -> Path:
    """Unpack the local blob into `dest` (which must not exist) through a partial sibling folder."""
    if dest.exists():
        raise BundleError(f"cannot unpack into {dest}: it already exists; remove it or pick another folder")
    tmp = _partial(dest)
    try:
        with blob.open("rb") as raw:
            extract(raw, tmp, files, limits, str(blob))
        fsutil.crash_point("unpack")
        os.replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    return dest


def tree_problems(tree: Path, files: tuple[FileEntry, ...]) -> list[str]:
    """Everything that differs between `tree` and `files` (every byte re-hashed); [] when whole."""
    found: dict[str, FileEntry] = {}
    if not tree.is_dir():
        return [f"{tree} is not there"]
    for root, dirs, names in os.walk(tree):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            rel = path.relative_to(tree).as_posix()
            try:
                if path.is_symlink():
                    target = os.readlink(path)
                    found[rel] = FileEntry(path=rel, size=0, sha256=_digest(target.encode()), link=target)
                elif path.is_file():
                    found[rel] = FileEntry(path=rel, size=path.stat().st_size, sha256=fsutil.file_digest(path))
            except (OSError, ValueError) as exc:
                return [f"{rel} cannot be read: {exc}"]
    wanted = {f.path: f for f in files}
    problems = [f"missing {p}" for p in sorted(wanted.keys() - found.keys())]
    problems += [f"unexpected {p}" for p in sorted(found.keys() - wanted.keys())]
    for p in sorted(wanted.keys() & found.keys()):
        if (wanted[p].sha256, wanted[p].link) != (found[p].sha256, found[p].link):
            problems.append(f"wrong bytes in {p}")
    return problems


# -- the extraction ---------------------------------------------------------------------------


class CheckedMembers(ABC):
    """One pass over a tar stream, each member held to the manifest before a byte of it is handed
    on; what becomes of the bytes is a subclass's: `_write` (a file, exactly its manifest's size, read
    with `_fill`), `_link`, and `_finish` / `_close` (after the end marker / always)."""

    def __init__(self, reader: io.BufferedReader, files: tuple[FileEntry, ...], what: str):
        self.reader, self.what = reader, what
        self.expected = {f.path: f for f in files}
        self.folders = {p for f in files for p in _parents(f.path)}
        self.seen: set[str] = set()
        self.members_left = len(files) + len(self.folders)

    def run(self) -> None:
        try:
            while (member := self._next()) is not None:
                self.members_left -= 1
                if self.members_left < 0:
                    raise UnsafeArchiveError(f"{self.what} holds more entries than its manifest names; refusing it")
                self._one(member)
            self._finish()
        finally:
            self._close()
        missing = sorted(self.expected.keys() - self.seen)
        if missing:
            raise BundleError(f"{self.what} lacks {len(missing)} file(s) its manifest names ({missing[:3]}); corrupt")

    def _one(self, m: Member) -> None:
        if m.type in (b"5", b"2") and m.size:
            raise UnsafeArchiveError(f"{self.what}: folder or link {m.name[:80]!r} claims {m.size} bytes of data")
        if m.type == b"5":
            name = m.name.rstrip("/")
            if name not in self.folders:
                raise UnsafeArchiveError(f"{self.what} holds a folder {name[:80]!r} no file of its manifest is in")
            return  # made, with every other folder of the manifest, by the folder thread
        entry = self.expected.get(m.name)
        if entry is None or m.name in self.seen:
            why = "twice" if m.name in self.seen else "which its manifest does not name"
            raise UnsafeArchiveError(f"{self.what} holds an entry {m.name[:80]!r} {why}; refusing it")
        self.seen.add(m.name)
        folder = m.name.rpartition("/")[0]
        if m.type == b"2":
            if entry.link != m.linkname:
                raise UnsafeArchiveError(f"{self.what}: {m.name[:80]!r} is a link its manifest does not declare")
            self._link(m.name, folder, m.linkname)
            return
        if m.type not in (b"0", b"\0"):
            kind = {b"1": "hard link", b"3": "device", b"4": "device", b"6": "FIFO"}.get(m.type, f"type {m.type!r}")
            raise UnsafeArchiveError(
                f"{self.what} holds a {kind} at {m.name[:80]!r}; bundles carry only files and links"
            )
        if entry.link is not None or entry.size != m.size:
            raise UnsafeArchiveError(
                f"{self.what}: {m.name[:80]!r} is {m.size} bytes in the archive, but its manifest says "
                f"{'a link' if entry.link is not None else f'{entry.size} bytes'}; refusing it before writing"
            )
        self._write(m.name, folder, entry)
        fsutil.crash_point("stream", entry.path)

    @abstractmethod
    def _write(self, name: str, folder: str, entry: FileEntry) -> None:
        """The member's bytes, exactly its manifest's size, read with `_fill` (and its padding skipped)."""

    @abstractmethod
    def _link(self, name: str, folder: str, target: str) -> None:
        """A symbolic link the manifest declares."""

    def _finish(self) -> None:  # noqa: B027 (a hook: nothing to do unless a subclass holds something)
        """The end marker was read and every member handed on."""

    def _close(self) -> None:  # noqa: B027 (a hook, as _finish)
        """Always, after `run`'s pass: whatever the subclass holds open is let go."""

    def _fill_upto(self, remaining: int, entry: FileEntry, view: memoryview) -> int:
        return self._fill(view[:remaining], remaining, entry)

    def _fill(self, view: memoryview, data: int, entry: FileEntry) -> int:
        """Read exactly len(view) bytes into `view`, of which the first `data` are the member's."""
        n = self.reader.readinto(view) if len(view) else 0
        if n < len(view):
            where = f"inside {entry.path!r}" if n < data else "in padding"
            raise BundleError(f"{self.what} ends {where}: the archive is truncated")
        return n

    def _next(self) -> Member | None:
        """The next member with its GNU long name / pax overrides applied; None at the end marker."""
        overrides: dict[str, str] = {}
        for _ in range(4):  # at most L, K and x records before a real member
            header = self.reader.read(_BLOCK)
            if len(header) < _BLOCK:
                raise BundleError(f"{self.what} ends inside a tar header: the archive is truncated")
            if header == bytes(_BLOCK):
                return None
            m = parse_header(header, self.what)
            if m.type in (b"L", b"K", b"x"):
                if m.size > _MAX_EXTENDED:
                    raise UnsafeArchiveError(f"{self.what} holds an extended header of {m.size} bytes; refusing it")
                data = self._exact(m.size)
                self._skip(-m.size % _BLOCK)
                overrides.update(extended(m.type, data, self.what))
                continue
            size = int(overrides.get("size", m.size))
            return Member(overrides.get("path", m.name), m.type, size, overrides.get("linkpath", m.linkname))
        raise UnsafeArchiveError(f"{self.what} chains extended headers without a member; refusing it")

    def _exact(self, n: int) -> bytes:
        data = self.reader.read(n) if n else b""
        if len(data) != n:
            raise BundleError(f"{self.what} is truncated")
        return data

    def _skip(self, n: int) -> None:
        self._exact(n)


class _Extraction(CheckedMembers):
    """The checked members written into the folder `into`, and nothing else."""

    def __init__(self, reader: io.BufferedReader, into: Path, files: tuple[FileEntry, ...], what: str):
        super().__init__(reader, files, what)
        self.into = into
        self.made = Folders(into, self.folders)
        self.writers = Writers(max(2, os.cpu_count() or 1), self.made)

    def _finish(self) -> None:
        self.writers.finish()
        self.made.finish()

    def _close(self) -> None:
        self.made.close()
        self.writers.close()  # every writer stopped and every file closed, even after a refusal

    def _link(self, name: str, folder: str, target: str) -> None:
        self.made.wait(folder)
        os.symlink(target, self.into / name)

    def _write(self, name: str, folder: str, entry: FileEntry) -> None:
        """Hand the member's bytes (exactly its manifest's size) to the writer threads, which create,
        write and hash it while this thread decompresses on (artifacts/bundle/unpack_write.py)."""
        target = str(self.into / name)
        size, pad = entry.size, -entry.size % _BLOCK
        if size + pad <= _LARGE:
            self.writers.small(target, folder, size, size + pad, entry, lambda view: self._fill(view, size, entry))
        else:
            job = self.writers.open_large(target, folder, entry)
            remaining = size
            while remaining:
                remaining -= self.writers.chunk(job, partial(self._fill_upto, remaining, entry))
            self._skip(pad)
            self.writers.end_large(job)


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# -- fed from a download ----------------------------------------------------------------------


def _extract_fed(feed: Feed, into: Path, files: tuple[FileEntry, ...], limits: UnpackLimits, what: str) -> None:
    try:
        extract(feed, into, files, limits, what)  # type: ignore[arg-type]
    except Aborted:
        feed.finished(None)
        return
    except BaseException as exc:
        feed.finished(exc)
        raise
    feed.finished(None)


# -- small helpers ------------------------------------------------------------------------------


def _partial(dest: Path) -> Path:
    import tempfile

    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))


def _remove(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
