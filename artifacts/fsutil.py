"""Atomic file operations and file locks: readers see a whole file or none, never a partial one.

Every write goes to a temporary name in the destination's folder, is flushed and fsynced, and
is then renamed (or hard-linked, for create-only) into place; a crash leaves at most a `.tmp-*`
file that `sweep_temporaries` removes later. `Flock` is flock(2) on a lock file, shared or
exclusive: the kernel drops it when its holder dies, even by kill -9, but it does not
coordinate machines over NFS. `crash_point` is the fault-injection hook of tests/faults
(PREBAKE_TEST_CRASH_AT; its docstring lists the points).
"""

from __future__ import annotations

import errno
import fcntl
import fnmatch
import hashlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prebake.artifacts.errors import BundleError, StoreError

TMP_PREFIX = ".tmp-"
CRASH_ENV = "PREBAKE_TEST_CRASH_AT"
FILL_ENV = "PREBAKE_TEST_FILL_AT"


@contextmanager
def atomic_target(dest: Path) -> Iterator[Path]:
    """Yield a temporary path beside `dest`; on success rename it over `dest`, else remove it."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + dest.name + ".", dir=dest.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        fill_point("write", dest.name)
        yield tmp
        _fsync_file(tmp)
        crash_point("write", dest.name)
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(dest: Path, data: bytes) -> None:
    with atomic_target(dest) as tmp:
        tmp.write_bytes(data)


def copy_file(src: Path, dest: Path) -> None:
    with atomic_target(dest) as tmp:
        shutil.copyfile(src, tmp)


def create_only(dest: Path, data: bytes) -> bool:
    """Write `dest` only if it does not exist yet; True if this call created it.

    A hard link from a complete temporary file is atomic and fails if the name exists,
    which makes this a conditional put on any local POSIX file system (not on NFS).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=TMP_PREFIX + dest.name + ".", dir=dest.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        crash_point("create", dest.name)
        try:
            os.link(tmp, dest)
        except FileExistsError:
            return False
        _fsync_dir(dest.parent)
        return True
    finally:
        tmp.unlink(missing_ok=True)


def read_bounded(path: Path, limit: int, *, within: Path | None = None, timeout_s: float = 10.0) -> bytes:
    """The bytes of the regular file `path`: at most `limit` of them, read within `timeout_s`.

    What a registry or store holds may be hostile, so anything but a regular file is refused
    (a link, a FIFO, a device: each could read forever), as is a file whose folder resolves
    outside `within`. Raises FileNotFoundError when absent, another OSError when the folder
    cannot be read, and BundleError for anything that is there but is not a fit file.
    """
    path = Path(path)
    if within is not None:
        root, parent = os.path.realpath(within), os.path.realpath(path.parent)
        if parent != root and not parent.startswith(root.rstrip(os.sep) + os.sep):
            raise BundleError(f"{path} lies through a link outside {within}; refusing to read it")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP and _is_link(path):
            raise BundleError(f"{path} is a link (only regular files are read); remove it") from exc
        raise  # ELOOP from a folder above it (a link loop): the folder's fault, not this file's
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a folder where a file should be", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise BundleError(f"{path} is not a regular file (a FIFO, device or folder); remove it")
        if st.st_size > limit:
            raise BundleError(f"{path} is {st.st_size} bytes, over the {limit} a file of its kind may have")
        chunks, total, deadline = [], 0, time.monotonic() + timeout_s
        while chunk := os.read(fd, min(1 << 20, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BundleError(f"{path} grew past {limit} bytes while it was read; refusing it")
            if time.monotonic() > deadline:
                raise BundleError(f"{path} took over {timeout_s:g} s to read; its file system is stalled")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:  # the folders above loop or vanished: not this file
        return False


def sweep_temporaries(root: Path, older_than_s: float = 3600.0) -> int:
    """Remove temporaries left by crashed writers (older than the grace period); return the count."""
    if not root.exists():
        return 0
    cutoff, removed = time.time() - older_than_s, 0
    for path in root.rglob(TMP_PREFIX + "*"):
        try:
            if path.lstat().st_mtime < cutoff:
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
                removed += 1
        except FileNotFoundError:
            continue
    return removed


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink in `path` durable."""
    _fsync_dir(path)


def copy_writable(tree: Path, dest: Path) -> Path:
    """A private, writable copy of a store tree (which is only ever read): engines such as
    Inductor and vLLM add files beside what they read, with no lock between processes.
    Links are copied as links; `dest` must not exist or hold nothing but empty folders (an engine
    pointed at it before the copy may have made its own, as Inductor's cache_dir() does)."""
    if dest.exists() and _holds_a_file(dest):
        raise StoreError(f"{dest} is not empty; give each engine process its own copy")
    dest.parent.mkdir(parents=True, exist_ok=True)
    need, count = _tree_size(tree)
    free = shutil.disk_usage(dest.parent).free
    if need > free:  # refused before the first byte, not after a copy that fills the disk
        raise StoreError(
            f"the private copy of {tree} needs {mib(need)} ({count} files) and {dest.parent} has {mib(free)} "
            f"free; free space on that disk (prebake gc --max-size) or point PREBAKE_HOME at a larger one"
        )
    try:
        shutil.copytree(tree, dest, symlinks=True, dirs_exist_ok=True)
    except OSError as exc:  # shutil.Error lists every failed file: one line says what went wrong first
        shutil.rmtree(dest, ignore_errors=True)
        raise StoreError(
            f"cannot copy {tree} to {dest}: {_first_copy_error(exc)}; free space or fix permissions on "
            f"{dest.parent}, then start again"
        ) from None
    for folder, _, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                os.chmod(path, path.stat().st_mode | 0o200)
    return dest


def _holds_a_file(folder: Path) -> bool:
    return any(files or any((Path(root) / d).is_symlink() for d in dirs) for root, dirs, files in os.walk(folder))


def _tree_size(tree: Path) -> tuple[int, int]:
    """Bytes a copy of `tree` takes, counting each file's blocks (4 KiB at least), and its file count."""
    total = count = 0
    for folder, _, files in os.walk(tree):
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            total += max(st.st_size, 4096)
            count += 1
    return total, count


def _first_copy_error(exc: OSError) -> str:
    errors = exc.args[0] if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) else None
    if not errors:
        return str(exc)[:300]
    src, _dst, why = errors[0]
    more = f" (and {len(errors) - 1} more file(s))" if len(errors) > 1 else ""
    return f"{src}: {str(why)[:200]}{more}"


def mib(n: int) -> str:
    """A byte count for messages: "12.5 MiB"."""
    return f"{n / (1 << 20):.1f} MiB"


def crash_point(point: str, subject: str = "") -> None:
    """Die by SIGKILL here if $PREBAKE_TEST_CRASH_AT names this point (and its glob matches `subject`).

    The fault-injection hook of tests/faults, exactly as `kill -9` would; the points:

        write:<glob>    atomic_target: the temporary file is complete, not yet renamed over <glob>
        create:<glob>   create_only: the temporary file is complete, not yet linked to <glob>
        unpack          bundle.unpack: every entry extracted into the partial folder, not yet renamed
        stream:<glob>   unpack_streamed: member <glob> written while the blob is still downloading
        evict           Store eviction: index entries gone, tree moved to tmp/, tree and blob not yet deleted
        move:<glob>     a folder registry's move aside (quarantine, promote): <glob> not yet renamed
        remove:<glob>   a folder registry's removal (prune): <glob> not yet deleted, what went before it gone

    <glob> matches the destination's file name (`write:*.tar.zst`). Unset (and $PREBAKE_TEST_FILL_AT
    unset), it costs two dictionary lookups.
    """
    fill_point(point, subject)
    wanted = os.environ.get(CRASH_ENV)
    if wanted and _names(wanted, point, subject):
        os.kill(os.getpid(), signal.SIGKILL)


def fill_point(point: str, subject: str = "") -> None:
    """Fill the disk here if $PREBAKE_TEST_FILL_AT is `<point>[:<glob>]=<file>`: `file` grows until the
    disk it is on is full, so the writes after this point meet a real ENOSPC (tests/operations, on a
    small tmpfs). The points are crash_point's; `write:<glob>` fills before the temporary is written."""
    wanted = os.environ.get(FILL_ENV)
    if not wanted:
        return
    spec, _, filler = wanted.partition("=")
    if not filler or not _names(spec, point, subject):
        return
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        for size in (64 << 10, 4096, 1):  # to the last byte
            block = b"\0" * size
            try:
                while os.write(fd, block):
                    pass
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def _names(wanted: str, point: str, subject: str) -> bool:
    name, _, pattern = wanted.partition(":")
    return name == point and (not pattern or fnmatch.fnmatchcase(subject, pattern))


class Flock:
    """A held flock(2) on a lock file; the kernel releases it if the holder dies.

    Whoever holds a lock exclusively may delete its file (`release(unlink=True)`): a process
    that opened the old file and then got the lock notices the file is gone and retries on
    the new one, so two holders can never each believe they hold the same lock.
    """

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    @classmethod
    def hold(cls, path: Path, *, shared: bool = False) -> Flock:
        """Lock `path`, waiting for whoever holds it."""
        lock = cls.acquire(path, shared=shared, wait=True)
        if lock is None:  # acquire only gives up when told not to wait
            raise StoreError(f"could not lock {path}")
        return lock

    @classmethod
    def acquire(cls, path: Path, *, shared: bool = False, wait: bool = True) -> Flock | None:
        """Lock `path` (created if absent); None if `wait` is False and another process holds it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | (0 if wait else fcntl.LOCK_NB)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, mode)
            except BlockingIOError:
                os.close(fd)
                return None
            except BaseException:
                os.close(fd)
                raise
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return cls(path, fd)
            except FileNotFoundError:
                pass
            os.close(fd)  # the file was deleted by the previous holder: lock its successor instead

    @classmethod
    def hold_existing(cls, path: Path) -> Flock | None:
        """Lock `path` shared through a read-only open, creating nothing (a read-only store); None if
        it is not there."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @staticmethod
    def is_held(path: Path) -> bool:
        """True while some process holds `path` locked. Opens it read-only and creates nothing, so it
        also answers on a read-only store (flock does not care how the file was opened)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self, *, unlink: bool = False) -> None:
        if self._fd < 0:
            return
        if unlink:
            Path(self.path).unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = -1

    def __enter__(self) -> Flock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_digest(path: Path) -> str:
    """ "sha256:<hex>" of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def human_size(n: int) -> str:
    """A byte count as people read it: 512 B, 3.2 MiB, 12.0 GiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            break
        value /= 1024
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
