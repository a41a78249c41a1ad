"""A snapshot's tree, as the bake writes it and a restore reads it.

snapshot/
  snapshot.json     SnapshotInfo: CRIU's version, the key factors, the pipes to reconnect,
                    every file the process mapped or held open (path, size, sha256, mode)
  images/           CRIU's image files (the process's anonymous memory, threads, registers);
                    pages-N.img a link to ../streamed/pages-N.img
  streamed/         CRIU's pages images: last in the (path-sorted) tar, streamed into CRIU (stream.py)
  carried/<sha256>  files the process mapped from the temporary folder (AOTInductor extracts
                    its packages' .so files there): put back at their paths, with their modes,
                    before a restore
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from prebake.artifacts.errors import BundleError
from prebake.artifacts.store.settings import default_home
from prebake.engine.bundled.snapshot.files import DigestCache, FileRecord

CONTROL_FD = 3  # the parked process reads its per-start settings here (prebake.engine.bundled.parked)
READY_LINE = "prebake-snapshot: parked"  # it prints this once warm, before it blocks on CONTROL_FD
EXIT_PREFIX = "prebake-snapshot: exits "  # its last line once restored: the code it exits with (restore.py)
INFO_FILE = "snapshot.json"
IMAGES_DIR = "images"
CARRIED_DIR = "carried"
STREAMED_DIR = "streamed"
FORMAT = 8  # 2: parked by `prebake serve --park`; 3: HTTP loaded before the dump; 4, 5: what is handed over;
# 6: modes; 7: the file pages it had mapped made present again after the restore (resident.py);
# 8: the pages images in streamed/, last in the tar


@dataclass(frozen=True)
class SnapshotInfo:
    format: int
    criu: str
    factors: dict[str, str]
    output_pipe: str  # "pipe:[inode]" of the parked process's stdout and stderr
    control_pipe: str  # "pipe:[inode]" of the pipe it reads its settings from
    files: tuple[FileRecord, ...]  # must match on the restoring host
    carried: tuple[FileRecord, ...]  # put back from carried/ at their paths

    def write(self, tree: Path) -> None:
        (tree / INFO_FILE).write_text(json.dumps(asdict(self), indent=1, sort_keys=True))

    @classmethod
    def read(cls, tree: Path) -> SnapshotInfo:
        path = tree / INFO_FILE
        try:
            text = path.read_text()
        except OSError as exc:
            raise BundleError(f"{path} is not a snapshot description ({exc}); bake the snapshot again") from exc
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, path: str) -> SnapshotInfo:
        """The description in `text` (read from `path`, for the error)."""
        try:
            raw = json.loads(text)
            if raw.get("format") != FORMAT:
                raise ValueError(f"format {raw.get('format')!r}, this prebake reads {FORMAT}")
            files = tuple(FileRecord(**f) for f in raw.pop("files"))
            carried = tuple(FileRecord(**f) for f in raw.pop("carried"))
            return cls(**raw, files=files, carried=carried)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise BundleError(f"{path} is not a snapshot description ({exc}); bake the snapshot again") from exc


def move_streamed(tree: Path) -> None:
    """CRIU's pages images of a fresh dump moved to streamed/, each left a relative link in images/
    (a restore from the store's tree reads them through it)."""
    for pages in sorted((tree / IMAGES_DIR).glob("pages-*.img")):
        (tree / STREAMED_DIR).mkdir(exist_ok=True)
        os.replace(pages, tree / STREAMED_DIR / pages.name)
        os.symlink(f"../{STREAMED_DIR}/{pages.name}", pages)


def carried_path(path: str, kept: tuple[str, ...] = ()) -> bool:
    """Whether a mapped file lives in a temporary folder (a per-process extraction: the system's, or
    the store's tmp/, where a start's run folder lies) and under none of the `kept` folders (the
    weights: checked, never carried): carried."""
    real = os.path.realpath(path)
    if any(real.startswith(os.path.realpath(folder) + os.sep) for folder in kept):
        return False
    temporary = (tempfile.gettempdir(), str(default_home() / "tmp"))
    return any(real.startswith(os.path.realpath(folder) + os.sep) for folder in temporary)


def put_back(tree: Path, carried: tuple[FileRecord, ...], cache: DigestCache) -> None:
    """put_back_from with the tree's carried/ files."""
    put_back_from(lambda record, temp: shutil.copyfile(tree / CARRIED_DIR / record.sha256, temp), carried, cache)


def put_back_from(
    write: Callable[[FileRecord, Path], object], carried: tuple[FileRecord, ...], cache: DigestCache
) -> None:
    """Each carried file at its path with its recorded permission bits (CRIU refuses a mapped file
    whose mode is not the dumped one: AOTInductor's wrapper .so is 0644, its kernels' 0755), written
    atomically by `write(record, temporary path)` (from carried/, or the bundle's verified bytes in a
    streamed restore) unless the file there already has the recorded digest and mode (another restore
    of the same image put it there)."""
    for record in carried:
        if not carried_path(record.path):
            raise BundleError(f"carried file {record.path} is outside the temporary folders; refused")
        target = Path(record.path)
        if _is_put_back(target, record, cache):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        write(record, temp)
        os.chmod(temp, record.mode)
        os.replace(temp, target)


def _is_put_back(target: Path, record: FileRecord, cache: DigestCache) -> bool:
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        return False
    return target.is_file() and mode == record.mode and cache.digest(str(target)) == record.sha256
