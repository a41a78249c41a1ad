"""Bundles that are already mounted: a Kubernetes image volume, a read-only hostPath or NFS export.

    prebake fetch --engine vllm --model M --mounted graphs=/bundles/graphs
    prebake serve --model M --mounted graphs=/bundles/graphs      (the bundled engine, and vLLM)

An image volume mounts the bundle's one OCI layer (prebake.registry.oci.artifact) read-only: the tree,
but not its manifest, and nothing about it proves it is the bundle this host's key wants. So a
mounted tree is taken only after it checked out: the key's manifest is looked up in the registry
(one small request) and verified like any fetched entry (key, trust policy: a signature where
PREBAKE_TRUSTED_KEYS asks for one), then every file of the tree is re-hashed against that
manifest's file list (tree_problems: missing, unexpected, wrong bytes; plus the executable bit).
A tree that differs in anything is refused with the differences named; nothing is copied from it.
A tree that matches is used in place: the engine's start copies only what it writes into its
private run folder (vLLM: the compile cache root; the bundled engine: its private graphs tree).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.unpack import tree_problems
from prebake.artifacts.errors import BundleError, RecipeError
from prebake.artifacts.fetch.outcome import Miss, Resolution
from prebake.artifacts.fetch.pipeline import lookup, verify
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.store.local import Installed
from prebake.engine.common.adapter import Services

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


def resolve_mounted(
    plan: TargetKeys,
    mounts: Mapping[str, Path],
    *,
    context: Services,
    lookup_timeout: float = 30.0,
) -> tuple[dict[str, Installed], tuple[Miss, ...]]:
    """Each mounted kind, checked against the verified manifest of its key; a kind whose key misses
    in the registry (or fails the trust policy) is a Miss, and its mounted tree is not used."""
    if not mounts:
        return {}, ()
    looked = lookup(
        plan,
        list(mounts),
        store=context.store,
        open_registry=lambda: context.registry,
        address=context.address,
        trust=context.trust,
        timeout=lookup_timeout,
    )
    checked = verify(plan, looked.found, looked.trust)
    installed: dict[str, Installed] = {}
    misses: list[Miss] = []
    for kind, tree in mounts.items():
        found = checked[kind]
        if isinstance(found, Miss):
            misses.append(found)
            continue
        manifest = found.manifest if isinstance(found, Installed) else found
        installed[kind] = check_mounted(tree, manifest)
    return installed, tuple(misses)


class _Asked(Protocol):
    @property
    def mounted(self) -> tuple[str, ...]: ...
    @property
    def registry_timeout(self) -> float: ...
    @property
    def fetch_timeout(self) -> float: ...


def resolve_with_mounts(plan: TargetKeys, request: _Asked, services: Services) -> Resolution:
    """The fetch pipeline for the kinds that are not mounted, and the mounted ones checked in place."""
    mounts = parse_mounts(request.mounted, plan.kinds.names)
    resolution = services.resolve(
        plan,
        lookup_timeout=request.registry_timeout,
        fetch_timeout=request.fetch_timeout,
        kinds=[k for k in plan.kinds.names if k not in mounts] if mounts else None,
    )
    if not mounts:
        return resolution
    on_mounts, misses = resolve_mounted(plan, mounts, context=services, lookup_timeout=request.registry_timeout)
    return replace(resolution, installed={**resolution.installed, **on_mounts}, misses=resolution.misses + misses)
