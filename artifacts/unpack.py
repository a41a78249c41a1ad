"""Checked unpacking: a .tar.zst stream written to a folder only as far as its manifest allows.

The manifest is the plan and the archive is held to it, member by member, before a byte
of the member is written:

    header read   name, type and size parsed by our own tar reader (never tarfile: its GNU
                  long-name and pax records are read whole into memory, whatever size they claim)
    checked       the name is one of the manifest's files (or a folder of one), not seen before;
                  its type is the manifest's (file or link, link target equal); its size is the
                  manifest's size for it
    written       exactly that many bytes, hashed while they are written (in a worker thread,
                  overlapped with decompression), the digest compared as soon as the member ends
    at the end    every file of the manifest was there

So the bytes written are bounded by the manifest's total, the entries by its file count,
and memory by one chunk, whatever the archive claims; a decompression bomb stops at the
first member that outgrows its declared size. Nothing is renamed into place unless all of
it passed (see bundle.unpack and unpack_streamed for the folder dance).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from . import fsutil
from .errors import BundleError, UnsafeArchiveError
from .feed import Aborted, Feed
from .manifest import MAX_PATH_BYTES, FileEntry
from .tarheader import BLOCK as _BLOCK
from .tarheader import Member, extended, parse_header

_CHUNK = 1 << 20
_MAX_EXTENDED = MAX_PATH_BYTES + 8192  # a GNU long name or pax record: a path and some change
_IN_FLIGHT = 16  # chunks handed to the hashing thread and not yet hashed
_HAND_OVER = 1 << 20  # files from this size on are hashed in the worker thread


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
    limits.check(files, what)
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << limits.max_window_log)
    try:
        with dctx.stream_reader(compressed, read_size=_CHUNK, closefd=False) as zr:
            _Extraction(io.BufferedReader(zr, _CHUNK), into, files, what).run()
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


class _Extraction:
    """One pass over a tar stream, writing what the manifest allows and nothing else."""

    def __init__(self, reader: BinaryIO, into: Path, files: tuple[FileEntry, ...], what: str):
        self.reader, self.into, self.what = reader, into, what
        self.expected = {f.path: f for f in files}
        self.folders = {p for f in files for p in _parents(f.path)}
        self.seen: set[str] = set()
        self.members_left = len(files) + len(self.folders)
        self.writer = _Writer(what)
        self.job: _FileJob | None = None
        self.made: set[str] = set()

    def run(self) -> None:
        try:
            while (member := self._next()) is not None:
                self.members_left -= 1
                if self.members_left < 0:
                    raise UnsafeArchiveError(f"{self.what} holds more entries than its manifest names; refusing it")
                self._one(member)
            self.writer.drain()
        finally:
            self.writer.close()
            if self.job is not None and self.job.fd >= 0:  # a member that failed half-way
                os.close(self.job.fd)
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
            self._folder(name)
            return
        entry = self.expected.get(m.name)
        if entry is None or m.name in self.seen:
            why = "twice" if m.name in self.seen else "which its manifest does not name"
            raise UnsafeArchiveError(f"{self.what} holds an entry {m.name[:80]!r} {why}; refusing it")
        self.seen.add(m.name)
        target = self.into / m.name
        self._folder(m.name.rpartition("/")[0])
        if m.type == b"2":
            if entry.link != m.linkname:
                raise UnsafeArchiveError(f"{self.what}: {m.name[:80]!r} is a link its manifest does not declare")
            os.symlink(m.linkname, target)
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
        self._write(target, entry)

    def _folder(self, rel: str) -> None:
        if rel and rel not in self.made:
            os.makedirs(self.into / rel, exist_ok=True)
            self.made.update(_parents(rel + "/x"))

    def _write(self, target: Path, entry: FileEntry) -> None:
        """Write the member's bytes here (os.write releases the GIL) and hash them in the writer
        thread, so decompressing, writing and hashing use two cores; small files are hashed inline,
        where handing them over would cost more than it saves."""
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        self.job = job = _FileJob(fd, entry, hashlib.sha256())
        hand_over = entry.size >= _HAND_OVER
        remaining = entry.size
        while remaining:
            chunk = self.reader.read(min(remaining, _CHUNK))
            if not chunk:
                raise BundleError(f"{self.what} ends inside {entry.path!r}: the archive is truncated")
            remaining -= len(chunk)
            job.write(chunk)
            self.writer.submit(job.hasher.update, chunk) if hand_over else job.hasher.update(chunk)
        self._skip(-entry.size % _BLOCK)
        job.close()
        self.writer.submit(job.check) if hand_over else job.check()
        fsutil.crash_point("stream", entry.path)

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


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# -- writing in a worker thread -----------------------------------------------------------------


@dataclass
class _FileJob:
    """One member being written: its file, what the manifest says of it, its running hash."""

    fd: int
    entry: FileEntry
    hasher: hashlib._Hash

    def write(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view:
            view = view[os.write(self.fd, view) :]

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if self.entry.executable:
            os.fchmod(fd, 0o755)
        os.close(fd)

    def check(self) -> None:
        if "sha256:" + self.hasher.hexdigest() != self.entry.sha256:
            raise BundleError(f"{self.entry.path!r} does not match its manifest's digest: the bundle is corrupt")


class _Writer:
    """Hashes large members in one worker thread while the caller decompresses and writes the next
    chunk (zstd, hashlib and os.write release the GIL, so the two run on two cores)."""

    def __init__(self, what: str):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="prebake-hash")
        self.pending: deque[Future[None]] = deque()
        self.what = what

    def submit(self, fn: Callable[..., None], *args: object) -> None:
        self.pending.append(self.pool.submit(fn, *args))
        while len(self.pending) > _IN_FLIGHT or (self.pending and self.pending[0].done()):
            self.pending.popleft().result()

    def drain(self) -> None:
        while self.pending:
            self.pending.popleft().result()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


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
