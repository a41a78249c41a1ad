"""Post-conditions of every fault scenario: is what readers can see whole and verified?

tree_problems      a tree against its manifest: every file there, every byte matching, nothing extra
store_problems     every tree a store's index names (what `Store.lookup` would hand out)
registry_damage    re-verify a registry deeply (prebake.registry.review.verify, --deep: every blob unpacked against its
                   file list; every signature checked when a policy is in force) and check the bundles
                   published to it are still there
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import file_digest


def tree_problems(tree: Path, manifest: Manifest) -> list[str]:
    """What is wrong with `tree` as the unpacked payload of `manifest`; [] when it is whole."""
    found: dict[str, str] = {}
    try:
        for root, dirs, files in os.walk(tree):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = Path(root, name)
                rel = path.relative_to(tree).as_posix()
                if path.is_symlink():
                    found[rel] = "sha256:" + hashlib.sha256(os.readlink(path).encode()).hexdigest()
                else:
                    found[rel] = file_digest(path)
    except FileNotFoundError as exc:
        return [f"{tree} changed while it was read: {exc}"]
    wanted = {f.path: f.sha256 for f in manifest.files}
    problems = [f"missing {p}" for p in sorted(wanted.keys() - found.keys())]
    problems += [f"unexpected {p}" for p in sorted(found.keys() - wanted.keys())]
    problems += [f"wrong bytes in {p}" for p in sorted(wanted.keys() & found.keys()) if wanted[p] != found[p]]
    if not tree.is_dir():
        problems.insert(0, f"{tree} is not there")
    return problems


def store_problems(home: Path) -> list[str]:
    """Every index entry of the store at `home` whose tree exists must name a whole, verified tree,
    and every blob it holds must hash right (`prebake verify --store`: prebake.artifacts.store.admin); an
    entry whose tree is gone is a miss, which readers handle."""
    from prebake.artifacts.store.admin import verify_store
    from prebake.artifacts.store.local import Store

    return [f"{f.blob_hex[:16]}: {p}" for f in verify_store(Store(home)).findings for p in f.problems]


@dataclass(frozen=True)
class Damage:
    lost: tuple[str, ...]  # published bundles that a reader can no longer get
    corrupted: tuple[str, ...]  # entries `prebake verify` finds bad

    @property
    def bundles(self) -> int:
        return len(self.lost) + len(self.corrupted)


def registry_damage(registry, published: list[Manifest], trust=None) -> Damage:
    """Re-verify `registry` (every entry, every blob re-hashed, under `trust` when given) and check each of
    `published` is still answered."""
    from prebake.registry.review.verify import verify_registry

    report = verify_registry(registry, trust=trust, quarantine=False, deep=True)  # every blob opened
    corrupted = tuple(f"{f.kind} {f.key_digest[:16]}: {f.problem}" for f in report.findings)
    lost = []
    for manifest in published:
        entry = registry.lookup(manifest.kind, manifest.key_digest)
        if entry is None or not entry.same_bundle(manifest):
            lost.append(
                f"{manifest.kind} {manifest.key_digest[:16]}: published, now {'gone' if entry is None else 'replaced'}"
            )
    return Damage(tuple(lost), corrupted)
