"""What a folder is before the store writes or deletes in it: a store of ours, or something to leave alone.

    <home>/prebake-store.json     {"format": "prebake-store", "version": 2}: written when the store is made
    <home>/installs/<blob-hex>    one per bundle this store installed: written before its blob is fetched,
                                  removed last on eviction; deleting commands touch only what these name

`look(home)` reads the mark and the top-level names only: new, store, legacy (a store from
before the mark, adopted by `claim`), newer, registry (a folder registry) or other (a user's
files). `claim(home)`, for every command that installs, records or deletes, refuses all but new,
store and legacy with StoreHomeError; `check_readable(home)` refuses a newer store only. Nothing
is written or deleted in a refused folder. Each case and its message: docs/trust-and-failure.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import prebake
from prebake.artifacts import fsutil
from prebake.artifacts.errors import StoreError

MARK = "prebake-store.json"
FORMAT = "prebake-store"
STORE_VERSION = 2  # 1: the unmarked stores of releases before the mark, adopted on first write
INSTALLS = "installs"
_MARK_MAX_BYTES = 4096
_HEX_LEN = 64
# Every name the store (and a bake or start using it) makes at the top of its home.
STORE_NAMES = frozenset(
    {
        MARK,
        INSTALLS,
        "registry",  # the embedded default registry
        "index",
        "blobs",
        "side",
        "trees",
        "caches",  # a tree's writable cache, beside the read-only tree (`prebake fetch`'s Inductor cache)
        "leases",
        "locks",
        "stats",
        "quarantine",
        "listing",
        "tmp",
        "revocations",  # the trust policy's copies of revocation lists
        "engines",  # vLLM's per-start cache roots
        "models",  # vLLM's downloaded models
    }
)
_STORE_PREFIXES = ("doit.db", ".prebake-probe-", fsutil.TMP_PREFIX)  # the bake's dependency file; probes; our writes
_STORE_RECORDS = ("trees", "locks", "leases")  # a registry has none of these
_REGISTRY_ONLY = ("meta", "summary")  # a store never has these at its top


class StoreHomeError(StoreError):
    """$PREBAKE_HOME cannot be used as the local store: not a folder, not writable, not creatable,
    not a prebake store, or a store of a newer prebake."""


@dataclass(frozen=True)
class Look:
    """What a folder is to the store: one of new, store, legacy, newer, registry, other; and why."""

    what: str
    detail: str = ""
    version: int | None = None


def look(home: Path) -> Look:
    """What `home` is, from its mark and the names at its top (never reading deeper than one level)."""
    mark = home / MARK
    try:
        raw = fsutil.read_bounded(mark, _MARK_MAX_BYTES)
    except FileNotFoundError:
        raw = None
    except (OSError, StoreError, ValueError) as exc:
        return Look("other", f"its {MARK} cannot be read ({exc})")
    if raw is not None:
        return _marked(raw)
    try:
        names = {n for n in os.listdir(home) if not n.startswith(_STORE_PREFIXES)}
    except (FileNotFoundError, NotADirectoryError):
        return Look("new")
    if not names:
        return Look("new")
    foreign = sorted(names - STORE_NAMES - set(_REGISTRY_ONLY))
    if foreign:
        more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        return Look("other", f"it holds files a store never makes: {', '.join(foreign[:5])}{more}")
    has_records = any(n in names for n in _STORE_RECORDS)
    holds_bundles = any(_holds_a_file(home / n) for n in ("index", "blobs") if n in names)
    if any(n in names for n in _REGISTRY_ONLY) or (holds_bundles and not has_records):
        shown = ", ".join(f"{n}/" for n in sorted(names & {"index", "blobs", "side", "meta", "summary"}))
        return Look("registry", f"it holds {shown} without the store's trees/, locks/ and leases/")
    if not has_records:  # only folders a store shares with a bake (stats/, registry/, tmp/ ...): nothing installed
        return Look("legacy", "no bundle installed yet")
    return Look("legacy", "a store made before stores were marked")


def _marked(raw: bytes) -> Look:
    try:
        data = json.loads(raw)
        fmt, version = data["format"], data["version"]
    except (ValueError, KeyError, TypeError):
        return Look("other", f"its {MARK} is not a prebake store's mark")
    if fmt != FORMAT or not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return Look("other", f"its {MARK} is not a prebake store's mark (format {fmt!r}, version {version!r})")
    if version > STORE_VERSION:
        by = data.get("release") if isinstance(data, dict) and isinstance(data.get("release"), str) else None
        made = f", made by {by[:80]}" if by else ""
        return Look(
            "newer",
            f"store format {version}{made}; this prebake ({release()}) reads format {STORE_VERSION} and older",
            version,
        )
    return Look("store", version=version)


def not_ours(home: Path, seen: Look) -> str:
    """The refusal for a folder that is not ours to write in, naming it, what it looks like and the fix."""
    if seen.what == "newer":
        return (
            f"{home} is a store of a newer prebake ({seen.detail}): this prebake neither reads, writes nor deletes "
            f"there; upgrade prebake, or point PREBAKE_HOME at another folder"
        )
    looks = {"registry": "looks like a folder registry", "other": "is not a prebake store"}[seen.what]
    return (
        f"{home} {looks}: {seen.detail}; prebake writes and deletes nothing there. Point PREBAKE_HOME at "
        f"the store's own folder (default ~/.cache/prebake), or a new or empty one"
        + (", and use this folder as PREBAKE_REGISTRY instead" if seen.what == "registry" else "")
    )


def claim(home: Path) -> None:
    """Make `home` a marked store of this format if it is new or a legacy store; else raise StoreHomeError.
    Safe when many processes claim at once: every write is an atomic rename of the same bytes."""
    seen = look(home)
    if seen.what == "store":
        return
    if seen.what not in ("new", "legacy"):
        raise StoreHomeError(not_ours(home, seen))
    home.mkdir(parents=True, exist_ok=True)
    if seen.what == "legacy":
        adopt_installed(home)
    payload = json.dumps({"format": FORMAT, "version": STORE_VERSION, "release": release()}, sort_keys=True) + "\n"
    temporary = home / f"{fsutil.TMP_PREFIX}{MARK}.{os.getpid()}"
    temporary.write_text(payload)  # not fsutil.write_bytes: the mark is no step a crash test aims at
    os.replace(temporary, home / MARK)


def release() -> str:
    """This release, as the mark records it and a refusal names it: "prebake <version>"."""
    return f"prebake {prebake.__version__}"


def check_readable(home: Path) -> None:
    """Raise StoreHomeError for a store this prebake could misread (a newer format); anything else reads."""
    seen = look(home)
    if seen.what == "newer":
        raise StoreHomeError(not_ours(home, seen))


def adoptable(home: Path) -> set[str]:
    """The blobs a legacy store provably installed: a tree trees/<hex> (or its trees/<hex>.files record, or
    its lease) is the store's own doing; a blob with none of these is never counted as installed."""
    hexes: set[str] = set()
    for folder in ("trees", "leases"):
        try:
            names = os.listdir(home / folder)
        except (FileNotFoundError, NotADirectoryError):
            continue
        hexes |= {n.removesuffix(".files") for n in names if _is_hex(n.removesuffix(".files"))}
    return hexes


def adopt_installed(home: Path) -> int:
    """Record as installed every bundle a legacy store provably installed (`adoptable`)."""
    hexes = adoptable(home)
    for hexd in hexes:
        record_install(home, hexd)
    return len(hexes)


def record_install(home: Path, hexd: str) -> None:
    """Write installs/<hex>: this store installs blob `hexd` (before fetching it), so it may delete it later."""
    path = home / INSTALLS / hexd
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()


def installed(home: Path, hexd: str) -> bool:
    return (home / INSTALLS / hexd).is_file()


def _holds_a_file(folder: Path) -> bool:
    """True if anything but folders lies under `folder` (stops at the first): empty folders lose nothing."""
    return any(files for _root, _dirs, files in os.walk(folder))


def _is_hex(name: str) -> bool:
    return len(name) == _HEX_LEN and all(c in "0123456789abcdef" for c in name)
