"""Bundle payloads: a folder packed as a deterministic, zstd-compressed tar, and unpacked safely.

    payload.tar.zst
    └── every file of the tree, sorted by path, owner 0:0, mtime 0, mode 0644 or 0755

The same tree always gives the same bytes and so the same sha256 (zstd runs with at
least one worker thread, in which mode its output does not depend on the number of
threads; artifacts.packing writes it). Unpacking goes into a temporary sibling folder that is renamed into place only
after every entry passed the safety checks and every file matched the manifest's
digest: an absolute path, a `..`, a link leaving the folder, an entry placed through a
link (a link to "." then a link to ".." under it reaches outside), a device file, or an
archive that decompresses past the caps is refused, and nothing is left behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import zstandard

from . import fsutil
from .errors import BundleError, UnsafeArchiveError
from .manifest import FileEntry
from .packing import Packed as Packed  # packing lives in artifacts.packing; re-exported here
from .packing import pack as pack

_CHUNK = 1 << 20


@dataclass(frozen=True)
class UnpackLimits:
    """Caps that stop a hostile or corrupt archive from filling the disk."""

    max_bytes: int = 64 << 30
    max_entries: int = 1_000_000
    max_window_log: int = 27  # 128 MiB, zstd's default ceiling for decompression


def unpack(
    blob: Path,
    dest: Path,
    files: tuple[FileEntry, ...],
    *,
    limits: UnpackLimits = UnpackLimits(),
) -> Path:
    """Unpack `blob` into `dest` (which must not exist), checking every entry against `files`."""
    dest = Path(dest)
    if dest.exists():
        raise BundleError(f"cannot unpack into {dest}: it already exists; remove it or pick another folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent))
    try:
        seen = _extract(blob, tmp, limits)
        _check_against_manifest(seen, files, blob)
        fsutil.crash_point("unpack")
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


# -- unpacking -------------------------------------------------------------------------------


def _extract(blob: Path, into: Path, limits: UnpackLimits) -> dict[str, FileEntry]:
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << limits.max_window_log)
    seen: dict[str, FileEntry] = {}
    total = entries = 0
    try:
        with (
            blob.open("rb") as raw,
            dctx.stream_reader(raw, read_size=_CHUNK) as zr,
            tarfile.open(fileobj=zr, mode="r|", bufsize=_CHUNK) as tar,
        ):
            for member in tar:
                entries += 1  # folders count too: a million empty folders fill a disk's inodes
                if entries > limits.max_entries:
                    raise UnsafeArchiveError(f"{blob} holds more than {limits.max_entries} entries; refusing it")
                total += max(member.size, 0)
                if total > limits.max_bytes:
                    raise UnsafeArchiveError(
                        f"{blob} unpacks to more than {limits.max_bytes} bytes; refusing it "
                        f"(raise PREBAKE_UNPACK_MAX_BYTES if the bundle is genuinely that large)"
                    )
                entry = _extract_one(tar, member, into, blob)
                if entry is not None:
                    seen[entry.path] = entry
    except zstandard.ZstdError as exc:
        if "memory" in str(exc) or "window" in str(exc).lower():
            raise UnsafeArchiveError(
                f"{blob} needs a zstd window above 2^{limits.max_window_log} bytes to decompress; refusing it "
                f"(prebake packs with smaller windows: this blob was not made by prebake)"
            ) from exc
        raise BundleError(f"{blob} is not a readable .tar.zst ({exc}); delete it and fetch it again") from exc
    except (tarfile.TarError, EOFError) as exc:
        raise BundleError(f"{blob} is not a readable .tar.zst ({exc}); delete it and fetch it again") from exc
    return seen


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, into: Path, blob: Path) -> FileEntry | None:
    """Write one entry under `into`; return what it holds, or None for a folder."""
    rel = _safe_relpath(member.name, blob)
    _check_no_link_on_the_way(into, rel, blob)
    target = into / rel
    if member.isdir():
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            raise UnsafeArchiveError(
                f"{blob} holds {member.name!r} twice, as a folder and as a file or link; refusing it"
            )
        target.mkdir(parents=True, exist_ok=True)
        return None
    if target.exists() or target.is_symlink():
        raise UnsafeArchiveError(f"{blob} holds {member.name!r} twice; refusing it")
    target.parent.mkdir(parents=True, exist_ok=True)
    if member.issym():
        _check_link(rel, member.linkname, blob)
        os.symlink(member.linkname, target)
        return FileEntry(
            path=rel,
            size=0,
            sha256="sha256:" + hashlib.sha256(member.linkname.encode()).hexdigest(),
            link=member.linkname,
        )
    if not member.isreg():
        kind = "hard link" if member.islnk() else "device or special file"
        raise UnsafeArchiveError(f"{blob} holds a {kind} at {member.name!r}; bundles carry only files and links")
    src = tar.extractfile(member)
    assert src is not None  # isreg() guarantees a file object
    h = hashlib.sha256()
    with target.open("xb") as out:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            out.write(chunk)
    os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
    return FileEntry(path=rel, size=member.size, sha256="sha256:" + h.hexdigest(), executable=bool(member.mode & 0o111))


def _safe_relpath(name: str, blob: Path) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or name.startswith(("/", "\\")) or ".." in p.parts or not p.parts or "\x00" in name:
        raise UnsafeArchiveError(f"{blob} holds an entry {name!r} that would land outside its folder; refusing it")
    return p.as_posix()


def _check_no_link_on_the_way(into: Path, rel: str, blob: Path) -> None:
    """Refuse an entry whose parent folders include a link: each link passed the check on its
    own, but a path through several of them can still leave the folder. Packing never
    descends into links, so no bundle prebake made has such an entry."""
    for parent in reversed(PurePosixPath(rel).parents[:-1]):
        if (into / parent).is_symlink():
            raise UnsafeArchiveError(f"{blob} places {rel!r} through the link {parent.as_posix()!r}; refusing it")


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


def _check_against_manifest(seen: dict[str, FileEntry], files: tuple[FileEntry, ...], blob: Path) -> None:
    expected, got = {f.path: f for f in files}, seen
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    changed = sorted(p for p in set(expected) & set(got) if expected[p].sha256 != got[p].sha256)
    if missing or extra or changed:
        raise BundleError(
            f"{blob} does not match its manifest (missing {missing[:3]}, unexpected {extra[:3]}, "
            f"changed {changed[:3]}); the bundle is corrupt or tampered: delete it and fetch it again"
        )


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
