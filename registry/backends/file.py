"""The file backend: a registry in a local folder (the embedded default) or a mounted one.

Conditional creation of index entries relies on hard links, which is atomic on local
POSIX file systems. `listing` (what `prebake ls` shows) keeps a verified summary per kind in
<root>/summary/<kind>.json, tagged by each entry's size, mtime and inode (artifacts/ports/listing.py). NFS does not give that guarantee: share bundles across nodes
through S3 or the Hub instead of a network folder.
"""

from __future__ import annotations

import difflib
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from prebake.artifacts import fsutil
from prebake.artifacts.bundle.manifest import MAX_MANIFEST_BYTES, Manifest
from prebake.artifacts.bundle.payload import file_digest
from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.layout import (
    blob_relpath,
    index_relpath,
    meta_relpath,
    parse_index_relpath,
    side_folder_relpath,
    side_relpath,
    summary_relpath,
)
from prebake.artifacts.ports.errors import BlobDigestMismatch, RegistryError, RegistryNotFound, RegistryUnavailable
from prebake.artifacts.ports.listing import Listed, ListingSummary, Read, summarised_listing
from prebake.artifacts.ports.registry import MAX_SIDE_FILE_BYTES
from prebake.registry.shared.transfer import Published, copy_verified, settle

log = logging.getLogger(__name__)

QUARANTINE = "quarantine"  # <root>/quarantine/ mirrors index/ and blobs/ for entries `prebake verify` moved aside


class FileRegistry:
    """index/ + blobs/ under one folder, written atomically."""

    writable = True

    def __init__(self, root: Path | str, *, create: bool = True):
        self.root = Path(os.path.abspath(Path(root).expanduser()))  # a relative folder would move with the cwd
        self.url = f"file://{self.root}"
        if not create and not self.root.is_dir():
            raise RegistryNotFound(_not_a_folder(self.root))

    def lookup(self, kind: str, key_digest: str) -> Manifest | None:
        path = self.root / index_relpath(kind, key_digest)
        try:
            raw = self._read_entry(path)
        except FileNotFoundError:
            return None
        return Manifest.parse(raw, str(path))

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        src = self.blob_path(digest)
        try:
            return copy_verified(src, dest, digest, where=str(src), registry_url=self.url, size=size, tee=tee)
        except FileNotFoundError:
            raise RegistryError(
                f"blob {digest} is named by an index entry but missing at {src}; run `prebake verify`"
            ) from None

    def publish(self, manifest: Manifest, blob: Path) -> Published:
        if file_digest(blob) != manifest.blob.digest:
            raise BlobDigestMismatch(f"{blob} does not hash to {manifest.blob.digest}; repack it before publishing")
        index = self.root / index_relpath(manifest.kind, manifest.key_digest)
        existing = self.lookup(manifest.kind, manifest.key_digest)
        if existing is not None:
            return settle(existing, manifest, str(index))
        target = self.blob_path(manifest.blob.digest)
        try:
            for folder in (target.parent, index.parent):  # leftovers of bakers killed mid-write
                fsutil.sweep_temporaries(folder, older_than_s=3600.0)
            if not target.exists():
                fsutil.copy_file(blob, target)
            if fsutil.create_only(index, manifest.to_bytes()):
                return Published(manifest, created=True, where=str(index))
        except OSError as exc:
            raise RegistryError(f"cannot publish into {self.root}: {exc}; free space or fix permissions") from exc
        return settle(Manifest.read(index), manifest, str(index))

    def put_side(self, blob_digest: str, name: str, data: bytes) -> bool:
        """Create side/<...>/<name> beside the blob (create-only, atomic)."""
        path = self.root / side_relpath(blob_digest, name)
        try:
            return fsutil.create_only(path, data)
        except OSError as exc:
            raise RegistryError(f"cannot write {path}: {exc}; free space or fix permissions") from exc

    def get_side(self, blob_digest: str, name: str) -> bytes | None:
        path = self.root / side_relpath(blob_digest, name)
        try:
            return fsutil.read_bounded(path, MAX_SIDE_FILE_BYTES, within=self.root)
        except FileNotFoundError:
            return None

    def put_meta(self, name: str, data: bytes) -> None:
        path = self.root / meta_relpath(name)
        try:
            fsutil.write_bytes(path, data)
        except OSError as exc:
            raise RegistryError(f"cannot write {path}: {exc}; free space or fix permissions") from exc

    def get_meta(self, name: str) -> bytes | None:
        try:
            return fsutil.read_bounded(self.root / meta_relpath(name), MAX_SIDE_FILE_BYTES, within=self.root)
        except FileNotFoundError:
            return None

    def list(self, kind: str | None = None) -> Iterator[Manifest]:
        """Every manifest, in (kind, digest) order. Names are listed and sorted as strings, then
        entries read one by one as they are consumed: a reader that wants a few reads a few."""
        base = self.root / "index"
        for k in [kind] if kind else sorted(n for n in _names(base) if (base / n).is_dir()):
            for name in sorted(_names(base / k)):
                if name.endswith(".json") and not name.startswith(fsutil.TMP_PREFIX):
                    path = base / k / name
                    try:
                        yield Manifest.parse(self._read_entry(path), str(path))
                    except FileNotFoundError:  # removed since the listing
                        continue

    def listing(self, kind: str | None = None) -> Iterator[Listed]:
        """A row for every entry, in list() order: stat each entry, read only those the kind's
        summary cannot answer for, and write the summary back when it was stale."""
        base = self.root / "index"
        kinds = [kind] if kind else sorted(n for n in _names(base) if (base / n).is_dir())
        yield from summarised_listing(self, ((k, digest, tag) for k in kinds for digest, tag in _tagged(base, k)))

    def blob_path(self, digest: str) -> Path:
        return self.root / blob_relpath(digest)

    def index_entries(self) -> Iterator[tuple[str, bytes | PrebakeError]]:
        """Every index entry as (relative path, raw bytes or why it cannot be read), unparsed, so a
        checker can report a bad one. Raises RegistryUnavailable when the folder is missing, not a
        folder, or cannot be listed: a checker must not report "0 entries" for a registry it cannot see."""
        self._check_root()
        index = self.root / "index"
        paths = [
            index / k / n
            for k in _listed_names(index)
            for n in _listed_names(index / k)
            if n.endswith(".json") and not n.startswith(".")
        ]
        for path in sorted(paths):
            if path.name.startswith(fsutil.TMP_PREFIX):
                continue
            try:
                raw: bytes | PrebakeError = self._read_entry(path)
            except FileNotFoundError:  # quarantined or removed since the listing
                continue
            except PrebakeError as exc:
                raw = exc
            yield path.relative_to(self.root).as_posix(), raw

    def quarantine(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> Path:
        """Move an index entry (then, if given, its bad blob) under <root>/quarantine/; return the entry's new path.

        The entry goes first, so readers miss from then on; the blob follows. Both are renames
        within the registry's folder, so each is atomic.
        """
        moved = self._move_aside(index_relpath(kind, key_digest))
        if moved is None:
            raise RegistryError(
                f"cannot quarantine {kind} {key_digest[:16]}: {self.root / index_relpath(kind, key_digest)} is gone"
            )
        if blob_digest is not None:
            self._move_aside(blob_relpath(blob_digest))  # None: an earlier entry naming it moved it already
        return moved

    def remove(self, kind: str, key_digest: str, *, blob_digest: str | None = None) -> None:
        """Delete an index entry, then (if given) its blob and the folder of files beside it."""
        paths = [self.root / index_relpath(kind, key_digest)]
        if blob_digest is not None:
            paths.append(self.blob_path(blob_digest))
        for path in paths:
            fsutil.crash_point("remove", path.name)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise RegistryError(
                    f"cannot remove {path}: {exc.strerror or exc}; fix the folder's permissions"
                ) from exc
            fsutil.fsync_dir(path.parent)
        if blob_digest is not None:
            shutil.rmtree(self.root / side_folder_relpath(blob_digest), ignore_errors=True)

    def __repr__(self) -> str:
        return f"FileRegistry({str(self.root)!r})"

    def _check_root(self) -> None:
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

    def _read_entry(self, path: Path) -> bytes:
        """An index entry's bytes: a regular file inside the registry, bounded in size and time."""
        try:
            return fsutil.read_bounded(path, MAX_MANIFEST_BYTES, within=self.root)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise RegistryUnavailable(
                f"cannot read {path}: {exc.strerror or exc}; check the folder's permissions and links"
            ) from exc

    def _read_rows(self, kind: str, digests: Sequence[str]) -> Iterator[Read]:
        for digest in digests:
            path = self.root / index_relpath(kind, digest)
            try:
                tag = _tag(os.stat(path))  # before the read: a change after it shows as a mismatch next time
                yield Read(digest, tag, Listed.of(Manifest.parse(self._read_entry(path), str(path))))
            except FileNotFoundError:  # removed since the listing
                yield Read(digest, "", None)

    def _load_summary(self, kind: str) -> ListingSummary | None:
        return ListingSummary.load(self.root / summary_relpath(kind), within=self.root)

    def _store_summary(self, summary: ListingSummary) -> None:
        summary.store(self.root / summary_relpath(summary.kind))

    def _move_aside(self, relpath: str) -> Path | None:
        src, dest = self.root / relpath, self.root / QUARANTINE / relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():  # quarantined before: keep both for whoever investigates
            dest = dest.with_name(f"{dest.name}.{time.time_ns()}")
        fsutil.crash_point("move", src.name)
        try:
            os.replace(src, dest)
        except FileNotFoundError:  # moved by an earlier entry or a concurrent verify
            return None
        except OSError as exc:
            raise RegistryError(f"cannot move {src} into {dest.parent}: {exc}; fix the folder's permissions") from exc
        for folder in (src.parent, dest.parent):
            fsutil.fsync_dir(folder)
        return dest


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
    near = sorted(n for n in _names(parent) if (parent / n).is_dir())
    close = difflib.get_close_matches(missing[0], near, n=1)
    guess = parent.joinpath(close[0], *missing[1:]) if close else None
    hint = f" (did you mean {guess}?)" if guess is not None and guess.is_dir() else ""
    return (
        f"registry folder {root} does not exist{hint}; fix the registry address, or bake into it first "
        f"(`prebake bake` and `doit bake` create it)"
    )


def _listed_names(folder: Path) -> list[str]:
    """A folder's names ([] when it is absent); RegistryUnavailable when it cannot be listed."""
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []
    except NotADirectoryError:  # a file among the kinds: no entries under it
        return []
    except OSError as exc:
        raise RegistryUnavailable(f"cannot list {folder}: {exc.strerror or exc}; fix the folder's permissions") from exc


def _names(folder: Path) -> list[str]:
    return _listed_names(folder)


def _tagged(base: Path, kind: str) -> list[tuple[str, str]]:
    """(key digest, size/mtime/inode) of the index entries of `kind` under `base`, sorted."""
    tagged = []
    try:
        with os.scandir(base / kind) as entries:
            for entry in entries:
                if (parsed := parse_index_relpath(f"index/{kind}/{entry.name}")) is not None:
                    try:
                        tagged.append((parsed[1], _tag(entry.stat())))
                    except FileNotFoundError:  # removed since the listing
                        continue
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(tagged)


def _tag(st: os.stat_result) -> str:
    return f"{st.st_size}/{st.st_mtime_ns}/{st.st_ino}"
