"""The folder backend: a registry in a local folder (the embedded default) or a mounted one.

FolderStore is the object-store port over a folder; the registry is the shared one
(prebake.registry.shared.index). What the folder guarantees it gets from the file system: a
create-only put is a hard link from a complete temporary file (atomic on local POSIX file systems,
not on NFS: share bundles across nodes through S3, Azure, OCI or the Hub instead), every write is
a rename of a complete temporary file, quarantine is a rename (the port's Movable capability), and
reads of small objects are bounded, of regular files only, inside the root. Version tags are
size/mtime/inode, so a listing summary answers for an entry until the file changes.
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.layout import blob_relpath
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.artifacts.ports.objects import Stored
from prebake.registry.shared.index import StoreRegistry

_CHUNK = 1 << 20
_WHOLE = 1 << 62  # a part larger than any blob


class FolderStore:
    """The object-store port over one folder; keys are paths relative to it."""

    writable = True

    def __init__(self, root: Path | str):
        self.root = Path(os.path.abspath(Path(root).expanduser()))  # a relative folder would move with the cwd
        self.url = f"file://{self.root}"

    def head(self, key: str) -> Stored | None:
        try:
            st = os.stat(self.path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise self._unreadable(key, exc) from exc
        return Stored(key, st.st_size, _tag(st))

    def get(self, key: str, limit: int) -> tuple[bytes, str] | None:
        """A regular file inside the root, at most `limit` bytes, read within a time bound."""
        path = self.path(key)
        try:
            tag = _tag(os.stat(path))  # before the read: a change after it shows as a mismatch next time
            return fsutil.read_bounded(path, limit, within=self.root), tag
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._unreadable(key, exc) from exc

    def read(self, key: str, first: int = 0, last: int | None = None) -> Iterator[bytes]:
        path = self.path(key)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RegistryError(f"{path} is gone; run `prebake verify`") from None
        except OSError as exc:
            raise self._unreadable(key, exc) from exc
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise BlobDigestMismatch(f"{path} is not a regular file; run `prebake verify --quarantine`")
            f.seek(first)
            left = None if last is None else last - first + 1
            while left is None or left > 0:
                chunk = f.read(_CHUNK if left is None else min(_CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def put(self, key: str, data: bytes | Path, *, create_only: bool = False) -> bool:
        """An atomic write (a complete temporary file renamed into place); create-only links it
        instead, which fails when the name is taken. Leftovers of writers killed mid-write go first."""
        path = self.path(key)
        try:
            fsutil.sweep_temporaries(path.parent, older_than_s=3600.0)
            if create_only:  # index entries and side files: small
                return fsutil.create_only(path, data.read_bytes() if isinstance(data, Path) else data)
            if isinstance(data, Path):
                fsutil.copy_file(data, path)
            else:
                fsutil.write_bytes(path, data)
        except OSError as exc:
            raise RegistryError(f"cannot write {path}: {exc}; free space or fix permissions") from exc
        return True

    def delete(self, key: str) -> None:
        path = self.path(key)
        fsutil.crash_point("remove", path.name)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RegistryError(f"cannot remove {path}: {exc.strerror or exc}; fix the folder's permissions") from exc
        fsutil.fsync_dir(path.parent)

    def move(self, key: str, dest: str) -> bool:
        """Rename `key` to `dest`, atomically (both are in the one folder); False when `key` is gone."""
        src, to = self.path(key), self.path(dest)
        try:
            to.parent.mkdir(parents=True, exist_ok=True)
            fsutil.crash_point("move", src.name)
            os.replace(src, to)
        except FileNotFoundError:  # moved by an earlier entry or a concurrent verify
            return False
        except OSError as exc:
            raise RegistryError(f"cannot move {src} into {to.parent}: {exc}; fix the folder's permissions") from exc
        for folder in (src.parent, to.parent):
            fsutil.fsync_dir(folder)
        return True

    def list(self, prefix: str) -> Iterator[Stored]:
        """Every file under `prefix` (temporaries and other dot files left out), in key order."""
        folder = prefix.rpartition("/")[0]
        for key, entry in sorted(self._walk(self.root / folder, f"{folder}/" if folder else "")):
            if key.startswith(prefix):
                try:
                    st = entry.stat()
                except FileNotFoundError:  # removed since the listing
                    continue
                yield Stored(key, st.st_size, _tag(st))

    def check_root(self) -> None:
        """RegistryUnavailable when the folder is missing or is not a folder: a checker must not
        report "0 entries" for a registry it cannot see."""
        try:
            st = os.stat(self.root)
        except FileNotFoundError:
            raise RegistryUnavailable(
                f"registry folder {self.root} does not exist; check the address (a typo, a missing mount?)"
            ) from None
        except OSError as exc:
            raise RegistryUnavailable(
                f"cannot open registry folder {self.root}: {exc.strerror or exc}; fix the path or its links"
            ) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise RegistryUnavailable(f"registry {self.root} is not a folder; point the address at the registry folder")

    def path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise RegistryError(f"{key!r} is not a key inside {self.root}; keys are relative paths without '..'")
        return self.root / key

    def _walk(self, folder: Path, rel: str) -> Iterator[tuple[str, os.DirEntry[str]]]:
        try:
            with os.scandir(folder) as listed:
                entries = list(listed)
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise RegistryUnavailable(
                f"cannot list {folder}: {exc.strerror or exc}; fix the folder's permissions"
            ) from exc
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path), f"{rel}{entry.name}/")
            else:
                yield f"{rel}{entry.name}", entry

    def _unreadable(self, key: str, exc: OSError) -> RegistryUnavailable:
        return RegistryUnavailable(
            f"cannot read {self.root / key}: {exc.strerror or exc}; check the folder's permissions and links"
        )


class FileRegistry(StoreRegistry):
    """index/ + blobs/ under one folder (prebake.registry.shared.index over FolderStore)."""

    def __init__(self, root: Path | str, *, create: bool = True):
        self.folder = FolderStore(root)
        self.root = self.folder.root
        if not create and not self.root.is_dir():
            raise RegistryNotFound(_not_a_folder(self.root))
        super().__init__(self.folder, part_bytes=_WHOLE)  # one sequential read: ranges buy a local disk nothing

    def blob_path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def index_entries(self) -> Iterator[tuple[str, bytes | PrebakeError]]:
        self.folder.check_root()
        yield from super().index_entries()

    def __repr__(self) -> str:
        return f"FileRegistry({str(self.root)!r})"

    def _where(self, key: str) -> str:
        return str(self.root / key)


def _not_a_folder(root: Path) -> str:
    """Why `root` cannot be a registry folder: a file, a symbolic link loop, or nothing there."""
    try:
        os.stat(root)
    except FileNotFoundError:
        return _missing_folder(root)
    except OSError as exc:  # a link loop (ELOOP), a path through a file, no permission on a parent
        return f"registry folder {root} cannot be reached ({exc.strerror}); fix the link or the registry address"
    return f"registry {root} is a file, not a folder; fix the registry address"


def _missing_folder(root: Path) -> str:
    """Why a registry folder is not there, with the nearest spelling that exists, for a typo in any part."""
    missing = [root.name]
    parent = root.parent
    while not parent.is_dir() and parent != parent.parent:
        missing.insert(0, parent.name)
        parent = parent.parent
    try:
        near = sorted(n for n in os.listdir(parent) if (parent / n).is_dir())
    except OSError:
        near = []
    close = difflib.get_close_matches(missing[0], near, n=1)
    guess = parent.joinpath(close[0], *missing[1:]) if close else None
    hint = f" (did you mean {guess}?)" if guess is not None and guess.is_dir() else ""
    return (
        f"registry folder {root} does not exist{hint}; fix the registry address, or bake into it first "
        f"(`prebake bake` and `doit bake` create it)"
    )


def _tag(st: os.stat_result) -> str:
    return f"{st.st_size}/{st.st_mtime_ns}/{st.st_ino}"
