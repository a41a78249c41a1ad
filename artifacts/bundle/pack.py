"""Packing: a folder into a deterministic `.tar.zst`, hashing every file on the way, at disk speed.

    tree/                                    payload.tar.zst
    ├── b/k.so   (0755, mtime t, uid u) ──▶  ├── a.json   0644 0:0 mtime 0
    ├── a.json                               ├── b/k.so   0755 0:0 mtime 0
    └── latest -> b/k.so                     └── latest -> b/k.so, end of archive (GNU tar, 10 KiB)

The bytes are those `tarfile` writes in GNU format (so older bundles keep their digests),
compressed by multi-threaded zstd, whose output does not depend on the thread count. Each byte is
read once, by reader threads ahead of the compressor (pack_read.py; docs/performance.md). The
blob is a scratch file, not fsynced: publishing copies it into place atomically.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import tarfile
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NamedTuple, cast

import zstandard

from prebake.artifacts.bundle.manifest import BlobRef, FileEntry
from prebake.artifacts.bundle.pack_read import Buffers, ChunkReader, unreadable
from prebake.artifacts.errors import BundleError, UnsafeArchiveError

_BLOCK, _RECORD = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
_ENCODING = tarfile.ENCODING  # what tarfile.open uses by default: the file system's encoding
_ZERO_IDS_SIZE_PREFIX = b"0000000\0" * 2  # uid, gid
_MTIME_CHECKSUM_PLACEHOLDER = b"00000000000\0" + b" " * 8  # mtime 0, then the checksum field as spaces
_GNU_TAIL = tarfile.TarInfo("x").tobuf(tarfile.GNU_FORMAT, _ENCODING, "surrogateescape")[257:]  # magic to padding,
# as this Python's tarfile writes it for a file with no owner names (device numbers: NUL or zeros by version)
_SMALL = 4 << 20  # files up to this size are read whole by a reader thread
_BATCH_BYTES = 2 << 20  # small files go to the reader threads in runs of about this size
_AHEAD_BYTES = 32 << 20  # read ahead at most this much of small files
_AHEAD_BATCHES = 16  # ... in at most this many runs


@dataclass(frozen=True)
class Packed:
    blob: BlobRef
    files: tuple[FileEntry, ...]


_Entry = tuple[str, str, os.stat_result]  # posix relative path, path, lstat


@dataclass(frozen=True)
class _Batch:
    """Consecutive small files (and links), ready to go into the stream: their tar bytes and manifest entries."""

    data: memoryview  # for each: header, contents, padding
    entries: tuple[FileEntry, ...]
    buffer: bytearray  # what data is a view of; back to the pool once the compressor has it


def pack(tree: Path, dest: Path, *, level: int = 3, threads: int | None = None) -> Packed:
    """Pack `tree` into `dest` (.tar.zst) deterministically; return the blob digest and file list."""
    tree = Path(tree)
    if not tree.is_dir():
        raise BundleError(f"cannot pack {tree}: it is not a folder")
    cores = os.cpu_count() or 1
    workers = max(1, threads if threads is not None else cores)
    compressor = zstandard.ZstdCompressor(level=level, threads=workers)
    files: list[FileEntry] = []
    try:
        with (
            _BlobWriter(Path(dest)) as sink,
            compressor.stream_writer(cast(BinaryIO, sink), closefd=False, write_size=1 << 20) as zw,
        ):
            offset = 0
            buffers = Buffers()
            for item in _in_order(_walk(tree), buffers, readers=max(2, cores)):
                if isinstance(item, _Batch):
                    zw.write(item.data)
                    offset += len(item.data)
                    files.extend(item.entries)
                    item.data.release()
                    buffers.give(item.buffer)
                else:
                    entry, written = _stream_large(zw, *item, buffers.chunk_pool())
                    offset += written
                    files.append(entry)
            zw.write(_end_of_archive(offset))
    except BaseException:
        Path(dest).unlink(missing_ok=True)  # a refused or failed pack leaves no half-written blob
        raise
    return Packed(blob=BlobRef(digest="sha256:" + sink.hexdigest(), size=sink.size), files=tuple(files))


def link_leaves_tree(rel: str, target: str) -> bool:
    """Whether a link at `rel` pointing to `target` resolves outside the tree it sits in."""
    depth = 0
    for part in (PurePosixPath(rel).parent / target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return os.path.isabs(target)


# -- the entries, in order ---------------------------------------------------------------------


def _walk(tree: Path) -> Iterator[_Entry]:
    """Every file and link under tree, in the order of their relative paths, listed as the
    packer asks for them: reading and compressing start with the first run of files, not after
    the whole tree has been listed (what that saves: docs/performance.md).

    A folder's entries are sorted by name, a sub-folder's name read as ending in "/". That is
    the order of the full paths: everything under sub-folder d starts with "d/", and any other
    name sorts against "d/" as it sorts against every path under d."""
    stack = [iter(_listing(str(tree), ""))]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
        elif isinstance(item, _Folder):
            stack.append(iter(_listing(item.path, item.prefix)))
        else:
            yield item


class _Folder(NamedTuple):
    path: str
    prefix: str  # its path relative to the tree, with a trailing "/"


def _listing(folder: str, prefix: str) -> list[_Entry | _Folder]:
    """One folder's files and links (as entries) and sub-folders, in path order."""
    try:
        with os.scandir(folder) as found:
            named = [(d.name + "/" if d.is_dir(follow_symlinks=False) else d.name, d) for d in found]
        named.sort(key=lambda item: item[0])
        return [
            _Folder(d.path, prefix + key)
            if key.endswith("/")
            else (prefix + key, d.path, d.stat(follow_symlinks=False))
            for key, d in named
        ]
    except OSError as exc:
        raise BundleError(
            f"cannot pack {folder}: {exc.strerror or exc}; make it readable, or leave it out of the tree"
        ) from exc


def _in_order(entries: Iterator[_Entry], buffers: Buffers, readers: int) -> Iterator[_Batch | _Entry]:
    """The entries in order: small ones as batches a pool of threads reads ahead, large ones as
    they are, for the caller to stream. Read-ahead is bounded in bytes and batches."""
    pending: deque[Future[_Batch] | _Entry] = deque()
    ahead = 0
    with ThreadPoolExecutor(max_workers=readers, thread_name_prefix="prebake-pack-read") as pool:
        for group in _groups(entries):
            if isinstance(group, list):
                pending.append(pool.submit(_read_batch, group, buffers))
                ahead += sum(st.st_size for _, _, st in group)
            else:
                pending.append(group)
            while len(pending) > _AHEAD_BATCHES or ahead > _AHEAD_BYTES:
                item = pending.popleft()
                if isinstance(item, Future):
                    batch = item.result()
                    ahead -= sum(e.size for e in batch.entries)
                    yield batch
                else:
                    yield item
        while pending:
            item = pending.popleft()
            yield item.result() if isinstance(item, Future) else item


def _groups(entries: Iterator[_Entry]) -> Iterator[list[_Entry] | _Entry]:
    """Runs of small entries up to _BATCH_BYTES each, and each large file on its own, in order."""
    run: list[_Entry] = []
    size = 0
    for item in entries:
        st = item[2]
        if stat.S_ISREG(st.st_mode) and st.st_size > _SMALL:
            if run:
                yield run
                run, size = [], 0
            yield item
            continue
        run.append(item)
        size += st.st_size + 2 * _BLOCK
        if size >= _BATCH_BYTES:
            yield run
            run, size = [], 0
    if run:
        yield run


def _read_batch(group: list[_Entry], buffers: Buffers) -> _Batch:
    """Read a run of small files (and links) straight into one reused buffer, as tar bytes."""
    try:
        return _fill_batch(group, buffers)
    except OSError as exc:
        raise unreadable(exc, exc.filename or group[0][1]) from exc


def _fill_batch(group: list[_Entry], buffers: Buffers) -> _Batch:
    targets = {path: os.readlink(path) for _, path, st in group if stat.S_ISLNK(st.st_mode)}  # each read once
    headers = [_small_header(rel, path, st, targets.get(path, "")) for rel, path, st in group]
    total = sum(len(h) + _padded(st.st_size) for h, (_, _, st) in zip(headers, group))
    buf = buffers.take(total + 1)  # one byte spare: a file that grew since the walk shows it
    view, at = memoryview(buf), 0
    entries = []
    for header, (rel, path, st) in zip(headers, group):
        view[at : at + len(header)] = header
        at += len(header)
        if stat.S_ISLNK(st.st_mode):
            target = targets[path]
            entries.append(_entry(rel, 0, "sha256:" + hashlib.sha256(target.encode()).hexdigest(), False, target))
            continue
        with open(path, "rb", buffering=0) as f:
            n = f.readinto(view[at : at + st.st_size + 1]) if st.st_size else len(f.read(1))
        _check_size(path, st, n)
        data = view[at : at + n]
        entries.append(_entry(rel, n, "sha256:" + hashlib.sha256(data).hexdigest(), bool(st.st_mode & 0o111)))
        at += n
        pad = -n % _BLOCK
        view[at : at + pad] = bytes(pad)
        at += pad
    return _Batch(view[:at], tuple(entries), buf)


def _small_header(rel: str, path: str, st: os.stat_result, target: str) -> bytes:
    if stat.S_ISLNK(st.st_mode):
        if link_leaves_tree(rel, target):
            raise UnsafeArchiveError(f"the tree holds a link {rel!r} -> {target!r} that leaves its folder; refusing it")
        return _header(rel, st, target)
    if not stat.S_ISREG(st.st_mode):
        raise BundleError(f"cannot pack {path}: only regular files and links can go into a bundle")
    return _header(rel, st)


def _padded(size: int) -> int:
    return size + (-size % _BLOCK)


def _stream_large(
    zw: BinaryIO, rel: str, path: str, st: os.stat_result, free: queue.SimpleQueue[bytearray]
) -> tuple[FileEntry, int]:
    """Feed one large file to the compressor chunk by chunk, while a thread reads and hashes the
    next chunks ahead of us into a few reused buffers (no fresh pages for each chunk)."""
    header = _header(rel, st)
    zw.write(header)
    with ChunkReader(path, st.st_size, free) as chunks:
        size = 0
        for view in chunks:
            zw.write(view)
            size += len(view)
    _check_size(path, st, size)
    zw.write(_padding(size))
    entry = _entry(rel, size, "sha256:" + chunks.hexdigest(), bool(st.st_mode & 0o111))
    return entry, len(header) + size + len(_padding(size))


def _entry(rel: str, size: int, digest: str, executable: bool, link: str | None = None) -> FileEntry:
    # Built without validation: every field comes from this module (a digest it just computed).
    return FileEntry.model_construct(path=rel, size=size, sha256=digest, executable=executable, link=link)


def _check_size(path: str, st: os.stat_result, read: int) -> None:
    if read != st.st_size:
        raise BundleError(f"{path} changed size while it was being packed; pack a tree nobody writes to")


# -- tar bytes, as tarfile writes them -----------------------------------------------------------


def _header(rel: str, st: os.stat_result, link: str = "") -> bytes:
    """The GNU tar header tarfile writes for this entry (owner 0:0, mtime 0, mode 0644/0755/0777).

    Built directly for the common case (names and link targets up to 100 bytes, files under
    8 GiB), which costs about a fifth of `TarInfo.tobuf`; anything else goes through tarfile itself.
    """
    name, target = rel.encode(_ENCODING, "surrogateescape"), link.encode(_ENCODING, "surrogateescape")
    size = st.st_size if stat.S_ISREG(st.st_mode) else 0
    mode = 0o777 if link else (0o755 if st.st_mode & 0o111 else 0o644)
    kind = tarfile.SYMTYPE if link else tarfile.REGTYPE
    if len(name) > 100 or len(target) > 100 or size >= 8**11:
        info = tarfile.TarInfo(rel)
        info.uid = info.gid = info.mtime = 0
        info.uname = info.gname = ""
        info.size, info.mode, info.type, info.linkname = size, mode, kind, link
        return info.tobuf(tarfile.GNU_FORMAT, _ENCODING, "surrogateescape")
    block = b"".join(
        (
            name.ljust(100, b"\0"),
            b"%07o\0" % mode,
            _ZERO_IDS_SIZE_PREFIX,
            b"%011o\0" % size,
            _MTIME_CHECKSUM_PLACEHOLDER,
            kind,
            target.ljust(100, b"\0"),
            _GNU_TAIL,
        )
    )
    checksum = sum(block)  # the placeholder's 8 spaces count as tar's checksum rule says
    return block[:148] + b"%06o\0" % checksum + block[155:]


def _padding(size: int) -> bytes:
    return bytes(-size % _BLOCK)


def _end_of_archive(offset: int) -> bytes:
    """Two zero blocks, then zeros up to a whole record, as tarfile closes an archive."""
    offset += 2 * _BLOCK
    return bytes(2 * _BLOCK + (-offset % _RECORD))


# -- the compressed output ---------------------------------------------------------------------


class _BlobWriter:
    """The compressor's sink: a thread digests and writes what it is given, so the caller does not wait."""

    def __init__(self, dest: Path):
        # A fresh file, not an old one truncated: ext4 flushes a truncated-and-rewritten file on close.
        dest.unlink(missing_ok=True)
        self._f = dest.open("xb")
        self._h, self.size = hashlib.sha256(), 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="prebake-pack-write", daemon=True)
        self._thread.start()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def _drain(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._h.update(data)
                    self.size += len(data)
                    self._f.write(data)
                except BaseException as exc:  # handed to the caller on its next write or at the end
                    self._error = exc

    def __enter__(self) -> _BlobWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._queue.put(None)
        self._thread.join()
        self._f.close()
        if self._error is not None and exc[0] is None:
            raise BundleError(f"cannot write {self._f.name}: {self._error}; free space or fix permissions")
