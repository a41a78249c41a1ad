"""Baking one artifact: build its tree, pack it, publish it, install it.

    inputs (upstream kinds, fetched) -> build(tree) -> pack -> Manifest -> registry.publish
                                                                         -> store.install

The build is the kind's declared builder (prebake.artifacts.bake.kinds.Kind.build: buckets are pure Python,
the engine adapters' autotune and graphs run in a child process), or one handed in (a write-back
packs what an engine compiled in place); its declared outputs are checked before anything is
packed. Losing a publish race to another baker of the same key is reported, not failed: the
registry keeps the first bundle and everybody uses it.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from prebake import __version__
from prebake.artifacts.bake.fetch import Miss, TrustCheck, fetch
from prebake.artifacts.bake.kinds import Builder, BuildRequest, TargetKeys
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.errors import BuildError, PublishConflict
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store.local import Installed, Store

Signer = Callable[[Manifest], Manifest]


@dataclass(frozen=True)
class Baked:
    manifest: Manifest
    installed: Installed
    created: bool  # False: an identical bundle was there already, or another baker won the race
    note: str


def bake_kind(
    plan: TargetKeys,
    kind: str,
    *,
    store: Store,
    registry: Registry,
    sign: Signer | None = None,
    trust: TrustCheck | None = None,
    build: Builder | None = None,
) -> Baked:
    """Build `kind` for `plan` (with its declared builder, or `build`), publish it to `registry`
    and install it into `store`."""
    declared = plan.kinds[kind]
    inputs = {k: _input(plan, k, store, registry, trust) for k in declared.upstream}
    key = plan.key(kind)
    scratch = store.scratch(f"bake-{kind}-{key.digest[:16]}-{os.getpid()}")
    try:
        tree = scratch / "tree"
        tree.mkdir()
        started = time.perf_counter()
        (build or declared.build)(BuildRequest(plan, kind, tree, {k: i.tree for k, i in inputs.items()}))
        build_seconds = round(time.perf_counter() - started, 3)  # what a hit of this bundle saves
        declared.check_outputs(tree, plan.target.name)
        packed = pack(tree, scratch / "payload.tar.zst")
        manifest = Manifest(
            kind=kind,
            key=key.to_json()["groups"],  # type: ignore[arg-type]
            key_digest=key.digest,
            labels=plan.labels,
            blob=packed.blob,
            files=packed.files,
            inputs={k: i.manifest.blob.digest for k, i in inputs.items()},
            created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            builder=f"prebake {__version__} on {platform.machine()} python {platform.python_version()}",
            build_seconds=build_seconds,
        )
        if sign is not None:
            manifest = sign(manifest)
        try:
            published = registry.publish(manifest, scratch / "payload.tar.zst")
            kept, created = published.manifest, published.created
            note = "published" if created else "already published (identical bundle)"
        except PublishConflict as exc:
            winner = registry.lookup(kind, key.digest)
            if winner is None:  # the entry that refused ours vanished: report the conflict itself
                raise
            kept, created, note = winner, False, f"another baker won: {exc}"
        installed = store.install(kept, registry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Baked(kept, installed, created, note)


def _input(plan: TargetKeys, kind: str, store: Store, registry: Registry, trust: TrustCheck | None) -> Installed:
    got = fetch(store, registry, plan.key(kind), trust=trust)
    if isinstance(got, Miss):
        raise BuildError(f"cannot build on {kind} of {plan.target.name}: {got.explain()}; bake {kind} first")
    return got
