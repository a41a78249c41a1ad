"""Verifying a local store deeply: every index entry, every tree byte, every blob, as readers would get them.

For each index entry of the store: it parses (bounded, like every manifest read); if its
tree is there, every file of the tree matches the manifest's file list byte for byte and
nothing else is in it, and the tree's recorded file list (`trees/<hex>.files`) is this
manifest's; if its blob is there, it hashes to its digest and has the declared size. An
entry whose tree is gone is a miss, which readers handle, not damage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from . import fsutil
from .errors import PrebakeError
from .manifest import MAX_MANIFEST_BYTES, Manifest
from .unpack import tree_problems


@dataclass(frozen=True)
class StoreReport:
    """What `verify_store` found: how many entries, and one line per problem."""

    home: Path
    entries: int
    problems: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def render(self) -> str:
        bad = len({p.split(":", 1)[0] for p in self.problems})
        lines = [f"verify store {self.home}: {self.entries} entries, {self.entries - bad} ok, {bad} bad"]
        return "\n".join(lines + [f"  BAD {p}" for p in self.problems])


def verify_store(home: Path) -> StoreReport:
    """Check every entry of the store at `home` (every tree and blob re-read)."""
    home = Path(home)
    entries, problems = 0, []
    for index in sorted(home.glob("index/*/*.json")):
        if index.name.startswith(fsutil.TMP_PREFIX):
            continue
        entries += 1
        name = f"{index.parent.name}/{index.name}"
        try:
            manifest = Manifest.parse(fsutil.read_bounded(index, MAX_MANIFEST_BYTES), str(index))
        except FileNotFoundError:
            continue
        except PrebakeError as exc:
            problems.append(f"{name}: {exc}")
            continue
        problems += [f"{name}: {p}" for p in _entry_problems(home, manifest)]
    return StoreReport(home, entries, tuple(problems))


def _entry_problems(home: Path, manifest: Manifest) -> list[str]:
    hexd = manifest.blob.hex
    tree, blob, record = home / "trees" / hexd, home / "blobs" / "sha256" / hexd[:2] / f"{hexd}.tar.zst", None
    problems = []
    if tree.is_dir():
        problems += tree_problems(tree, manifest.files)
        try:
            record = fsutil.read_bounded(home / "trees" / f"{hexd}.files", 128).decode("ascii", "replace")
        except (FileNotFoundError, PrebakeError):
            pass
        if record is not None and record != manifest.files_digest():
            problems.append(f"tree {hexd[:16]} was verified against another file list")
    if blob.is_file():
        h, size = hashlib.sha256(), 0
        with blob.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
        if "sha256:" + h.hexdigest() != manifest.blob.digest or size != manifest.blob.size:
            problems.append(f"blob {hexd[:16]} does not hash to its digest or has the wrong size")
    return problems
