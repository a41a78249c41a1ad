"""Bundles that are already mounted (a Kubernetes image volume, a read-only hostPath or NFS
export), given as `--mounted KIND=PATH` to fetch and serve, for every engine.

An image volume mounts a bundle's one OCI layer: the tree, not its manifest, so nothing about it
proves it is the bundle this host's key wants. The fetch pipeline (pipeline.resolve) looks the
key's manifest up and verifies it like any fetched entry, then `check_mounted` re-hashes
every file of the tree against it (missing, unexpected, wrong bytes, the executable bit); a tree
that differs is refused with the differences named, one that matches is used in place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.unpack import tree_problems
from prebake.artifacts.errors import BundleError, RecipeError
from prebake.artifacts.fetch.outcome import Found, Miss
from prebake.artifacts.store.local import Installed

_SHOWN = 8  # differences named in a refusal


def parse_mounts(values: Sequence[str], kinds: Sequence[str]) -> dict[str, Path]:
    """`KIND=PATH` pairs (from --mounted) as a mapping; a malformed one names the form it takes."""
    out: dict[str, Path] = {}
    for value in values:
        kind, sep, path = value.partition("=")
        if not sep or not kind or not path:
            raise RecipeError(f"--mounted {value!r}: write KIND=PATH, e.g. --mounted graphs=/bundles/graphs")
        if kind not in kinds:
            raise RecipeError(f"--mounted {value!r}: {kind!r} is not a kind of this target ({', '.join(kinds)})")
        if not Path(path).is_dir():
            raise RecipeError(f"--mounted {value!r}: {path} is not a folder; is the volume mounted there?")
        out[kind] = Path(path)
    return out


def check_mounted(tree: Path, manifest: Manifest) -> Installed:
    """The mounted `tree` as an installed bundle of `manifest`, once every file matched it."""
    problems = tree_problems(tree, manifest.files)
    for f in manifest.files:
        path = tree / f.path
        if not problems and f.link is None and bool(os.stat(path).st_mode & 0o100) != f.executable:
            problems.append(f"{f.path} is {'not ' if f.executable else ''}executable, unlike its manifest")
    if problems:
        more = f" and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        raise BundleError(
            f"the tree mounted at {tree} is not the {manifest.kind} bundle {manifest.key_digest[:16]} "
            f"(blob {manifest.blob.digest[:23]}) its signed manifest describes: {'; '.join(problems[:_SHOWN])}{more}; "
            f"mount the image of that bundle (tag {manifest.kind}-{manifest.key_digest}), or drop --mounted to fetch it"
        )
    return Installed(manifest, tree)


def in_place(found: dict[str, Found], mounted: Mapping[str, Path]) -> tuple[dict[str, Found], str]:
    """`found` with each mounted tree checked file by file against its kind's verified manifest and
    used in place (BundleError if it differs), and what was checked, for the verify step's detail."""
    checked, detail = dict(found), ""
    for kind, tree in mounted.items():
        value = found.get(kind)
        if value is not None and not isinstance(value, Miss):
            checked[kind] = check_mounted(tree, value.manifest if isinstance(value, Installed) else value)
            detail += f"; {kind} mounted at {tree} matches it"
    return checked, detail
