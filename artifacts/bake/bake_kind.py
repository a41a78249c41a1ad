"""Baking one artifact: build its tree, pack it, publish it, install it.

    inputs (upstream kinds, fetched) -> build(tree) -> pack -> Manifest -> registry.publish -> store.install
                                        provenance Statement / model signature -> beside the blob

The build is the kind's declared builder or one handed in (a write-back packs what an engine
compiled in place); its declared outputs are checked before packing. Upstream bundles are
fetched under the trust policy unless the caller hands in the ones it built on. With `Attest`
or `ModelSign`, their side files are published before the index entry that names the blob, so
a reader of the entry can already read them. Losing a publish race is reported, not failed:
the registry keeps the first bundle and everybody uses it.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake import __version__
from prebake.artifacts.bake.provenance import SIDE_NAME, Attest, statement
from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.errors import BuildError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.ports.errors import PublishConflict, UntrustedEntryError
from prebake.artifacts.ports.registry import Registry, SideFiles, TrustCheck
from prebake.artifacts.recipe.kinds import Builder, BuildRequest, TargetKeys
from prebake.artifacts.store.local import Installed, Store

Signer = Callable[[Manifest], Manifest]
ModelSign = Callable[[Path], bytes]  # a tree -> its OpenSSF model signature (registry.model_signatures)
MODEL_SIGNATURE_SIDE_NAME = "model.sig"  # prebake.registry.trust.model_signatures.SIDE_NAME


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
    attest: Attest | None = None,
    inputs: Mapping[str, Installed] | None = None,
    model_sign: ModelSign | None = None,
) -> Baked:
    """Build `kind` for `plan` (with its declared builder, or `build`, on the upstream bundles
    `inputs` when given), publish it to `registry` and install it into `store`."""
    declared = plan.kinds[kind]
    given = inputs or {}
    inputs = {k: given[k] if k in given else _input(plan, k, store, registry, trust) for k in declared.upstream}
    key = plan.key(kind)
    scratch = store.scratch(f"bake-{kind}-{key.digest[:16]}-{os.getpid()}")
    try:
        tree = scratch / "tree"
        tree.mkdir()
        started, started_at = time.perf_counter(), dt.datetime.now(dt.UTC)
        (build or declared.build)(BuildRequest(plan, kind, tree, {k: i.tree for k, i in inputs.items()}))
        build_seconds = round(time.perf_counter() - started, 3)  # what a hit of this bundle saves
        declared.check_outputs(tree, plan.target.name)
        packed = pack(tree, scratch / "payload.tar.zst")
        manifest = Manifest(
            kind=kind,
            key=key.to_json()["groups"],  # type: ignore[arg-type]
            key_digest=key.digest,
            labels={**plan.labels, **declared.labels(tree)},  # what the tree says of itself: listings
            blob=packed.blob,
            files=packed.files,
            inputs={k: i.manifest.blob.digest for k, i in inputs.items()},
            created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            builder=f"prebake {__version__} on {platform.machine()} python {platform.python_version()}",
            build_seconds=build_seconds,
        )
        if sign is not None:
            manifest = sign(manifest)
        if attest is not None:
            _publish_attestation(registry, manifest, plan, attest, started_at)
        if model_sign is not None:
            _side_files(registry, "an OpenSSF model signature", "PREBAKE_MODEL_SIGNING_KEY").put_side(
                manifest.blob.digest, MODEL_SIGNATURE_SIDE_NAME, model_sign(tree)
            )
        try:
            published = registry.publish(manifest, scratch / "payload.tar.zst")
            kept, created = published.manifest, published.created
            note = "published" if created else "already published (identical bundle)"
        except PublishConflict as exc:
            winner = registry.lookup(kind, key.digest)
            if winner is None:  # the entry that refused ours vanished: report the conflict itself
                raise
            kept, created, note = winner, False, f"another baker won: {exc}"
        _check_adoptable(kept, trust, registry)
        installed = store.install(kept, registry)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Baked(kept, installed, created, note)


def _publish_attestation(
    registry: Registry, manifest: Manifest, plan: TargetKeys, attest: Attest, started: dt.datetime
) -> None:
    """The signed provenance of `manifest`'s blob, beside the blob; one there already stands (created once)."""
    side = _side_files(registry, "an attestation", "a signing key")
    document = statement(
        manifest, plan.recipe, plan.target, attest.context, started=started, finished=dt.datetime.now(dt.UTC)
    )
    side.put_side(manifest.blob.digest, SIDE_NAME, attest.seal(document))


def _side_files(registry: Registry, what: str, without: str) -> SideFiles:
    if not isinstance(registry, SideFiles):
        raise BuildError(
            f"{registry.url} cannot keep {what} beside the blob; publish to a folder, S3, Hub or OCI "
            f"registry, or bake without {without}"
        )
    return registry


def _check_adoptable(kept: Manifest, trust: TrustCheck | None, registry: Registry) -> None:
    """A bundle the registry already held is adopted only if the policy in force accepts it."""
    why = None if trust is None else trust(kept)
    if why is not None:
        raise UntrustedEntryError(
            f"{registry.url} already holds {kept.kind} {kept.key_digest[:16]} (blob {kept.blob.hex[:12]}), and "
            f"the trust policy in force refuses it: {why}; it was not adopted and nothing was installed. Move it "
            f"aside with `prebake verify --quarantine` under this policy, then bake again"
        )


def _input(plan: TargetKeys, kind: str, store: Store, registry: Registry, trust: TrustCheck | None) -> Installed:
    got = fetch_key(store, registry, plan.key(kind), trust=trust)
    if isinstance(got, Miss):
        raise BuildError(f"cannot build on {kind} of {plan.target.name}: {got.explain()}; bake {kind} first")
    return got
