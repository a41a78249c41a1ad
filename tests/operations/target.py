"""A real recipe's bundle set for the operations scenarios: tiny-llama bf16 on this host, under its
real keys, with synthetic payloads.

`prebake fetch` and `prebake serve --on-miss fail` look these up, verify, bound-check and
install them exactly as they would a bake's (no command reads a payload before installing
it), so a scenario about the store, its bound or the registry chain runs in seconds instead
of compiling graphs. Scenarios that need a payload the engine loads use a real eager bake
(tests/operations/conftest.py, `baked`).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.common.probe import current_host
from prebake.engine.compose import plans_for
from prebake.registry.backends.file import FileRegistry
from tests.support.baking import BIN, REPO

MODEL, PRECISION = "tiny-llama", "bf16"
KINDS = ("buckets", "autotune", "graphs")


@dataclass(frozen=True)
class TargetSet:
    plan: TargetKeys
    manifests: dict[str, Manifest]
    blobs: dict[str, Path]

    @property
    def bytes(self) -> int:
        """What the set takes in a store: each blob and its unpacked tree."""
        return sum(m.blob.size + m.unpacked_bytes for m in self.manifests.values())


def tiny_llama_plan() -> TargetKeys:
    return plans_for(load_recipe(MODEL), current_host(), dtype=PRECISION)[0]


def target_set(workdir: Path, payload_bytes: dict[str, int] | None = None) -> TargetSet:
    """Bundles answering tiny-llama bf16's keys here; graphs is the largest, as in a real bake."""
    plan = tiny_llama_plan()
    sizes = payload_bytes or {"buckets": 64 << 10, "autotune": 128 << 10, "graphs": 512 << 10}
    manifests, blobs = {}, {}
    for kind in KINDS:
        key = plan.key(kind)
        tree = workdir / "trees" / kind
        (tree / "sub").mkdir(parents=True, exist_ok=True)
        (tree / "sub" / "entry.txt").write_text(f"{kind} of {plan.target.name}\n")
        (tree / "payload.bin").write_bytes(random.Random(kind).randbytes(sizes[kind]))
        blob = workdir / "blobs" / f"{kind}.tar.zst"
        blob.parent.mkdir(parents=True, exist_ok=True)
        packed = pack(tree, blob, level=1)
        manifests[kind] = Manifest(
            kind=kind,
            key={group: dict(factors) for group, factors in key.groups},
            key_digest=key.digest,
            labels={"model": MODEL, "precision": PRECISION},
            blob=packed.blob,
            files=packed.files,
            created="2026-12-01T09:00:00Z",
            builder="operations-test",
        )
        blobs[kind] = blob
    return TargetSet(plan, manifests, blobs)


def synthetic(workdir: Path, key, files: dict[str, bytes], labels: dict[str, str] | None = None):
    """A bundle answering `key` whose tree holds `files` (relative path -> bytes): (manifest, blob)."""
    tree = workdir / "trees" / key.digest[:16]
    for rel, data in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    blob = workdir / "blobs" / f"{key.digest[:16]}.tar.zst"
    blob.parent.mkdir(parents=True, exist_ok=True)
    packed = pack(tree, blob, level=1)
    manifest = Manifest(
        kind=key.kind,
        key={group: dict(factors) for group, factors in key.groups},
        key_digest=key.digest,
        labels=labels or {},
        blob=packed.blob,
        files=packed.files,
        created="2026-12-01T09:00:00Z",
        builder="operations-test",
    )
    return manifest, blob


def publish(registry, targets: TargetSet) -> None:
    for kind in KINDS:
        registry.publish(targets.manifests[kind], targets.blobs[kind])


def published_set(workdir: Path, scenario) -> tuple[FileRegistry, TargetSet]:
    """tiny-llama's whole set in a folder registry under `workdir`, registered with the scenario
    for re-verification when it ends."""
    targets = target_set(workdir / "bake")
    registry = FileRegistry(workdir / "registry")
    publish(registry, targets)
    scenario.registry(registry, *targets.manifests.values())
    return registry, targets


def prebake_env(home: Path | str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREBAKE_", "AWS_"))}
    return {**env, "PREBAKE_HOME": str(home), "PREBAKE_TRUSTED_KEYS": "", **extra}


def prebake(
    *args: str, env: dict[str, str], cwd: Path = REPO, timeout: float = 120, **popen
) -> subprocess.CompletedProcess:
    """One `prebake` command, as an operator runs it."""
    return subprocess.run(
        [str(BIN / "prebake"), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **popen
    )


def fetch_args(registry: str | Path, *more: str) -> list[str]:
    return ["fetch", "--model", MODEL, "--precision", PRECISION, "--registry", str(registry), *more]


def python() -> str:
    return sys.executable
