"""Push a vLLM target's baked graphs as a KServe/GKM kernel-cache image: the use case of `prebake kernel-cache`.

    KernelCacheRequest(model, to="oci://HOST/team/vllm-cache:TAG")  ->  push_kernel_cache(request, open_context)
        checks the address, the pairing of runtime image and model URI, and that the recipe is vLLM's
        resolves the target's graphs bundle (lookup, the trust policy in force, install), checked to
        hold every tensor-parallel rank's compile cache (prebake.engine.vllm.ranks)
        describes the installed cache tree (cache_tree.py) and builds the image in the store's scratch
            (registry/oci/kernel_cache.py)
        pushes it with prebake's OCI client: Pushed, or NotBaked with the misses

The command only parses its flags and prints the report (engine/cli/kernel_cache.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Protocol

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.fetch.outcome import Miss, Resolution
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.common.advice import bake_command
from prebake.engine.vllm.cache_tree import DEFAULT_CACHE_PATH, read_cache_tree


class KernelCacheContext(Protocol):
    """What the use case needs from the composition root (prebake.engine.compose.Context satisfies this)."""

    @property
    def holds(self) -> ExitStack: ...

    def pick_plan(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> TargetKeys: ...

    @property
    def store(self) -> Store: ...

    def resolve(self, plan: TargetKeys, *, kinds: list[str]) -> Resolution: ...


@dataclass(frozen=True)
class KernelCacheRequest:
    """`prebake kernel-cache`'s flags: the target, where the image goes, KServe's footprint inputs."""

    model: str
    to: str  # oci://HOST[:PORT]/NAMESPACE/REPO:TAG
    precision: str | None = None
    tp: int | None = None
    runtime_image: str | None = None
    model_uri: str | None = None
    cache_path: str = DEFAULT_CACHE_PATH

    def address_and_tag(self) -> tuple[str, str]:
        """(oci://HOST/REPO, TAG); PrebakeError naming the form when --to is not one."""
        address, _, tag = self.to.rpartition(":")
        if not address.startswith("oci://") or "/" in tag or not tag:
            raise PrebakeError(f"--to {self.to!r}: write oci://HOST[:PORT]/NAMESPACE/REPO:TAG")
        return address, tag


@dataclass(frozen=True)
class Pushed:
    """The image pushed: where, for which target and key, and what it declares."""

    image: str  # HOST/REPO@sha256:...
    tag: str  # HOST/REPO:TAG
    target: str
    key: str
    labels: dict[str, str]
    factors: dict[str, str]
    footprint: str | None
    ranks: tuple[int, ...] = (0,)  # the tensor-parallel ranks whose compile cache the image holds

    def to_json(self) -> dict[str, object]:
        return {
            "ranks": list(self.ranks),
            "image": self.image,
            "tag": self.tag,
            "target": self.target,
            "key": self.key,
            "labels": self.labels,
            "factors": self.factors,
            "compatibilityFootprint": self.footprint,
        }

    def render(self) -> str:
        lines = [f"prebake: {self.target} graphs -> {self.tag} ({self.image})"]
        return "\n".join([*lines, *(f"  {name} = {value}" for name, value in sorted(self.factors.items()))])


@dataclass(frozen=True)
class NotBaked:
    """The target's graphs bundle is neither in the store nor in the registry: bake it first."""

    model: str
    misses: tuple[Miss, ...]

    def to_json(self) -> dict[str, object]:
        return {"complete": False, "misses": [m.to_json() for m in self.misses]}

    def render(self) -> str:
        return "\n".join([*(m.explain() for m in self.misses), f"prebake: bake it first: {bake_command(self.model)}"])


def push_kernel_cache(request: KernelCacheRequest, open_context: Callable[[], KernelCacheContext]) -> Pushed | NotBaked:
    """Check the request (before anything opens), resolve the target's graphs, build the image in scratch
    and push it."""
    from prebake.registry.oci.kernel_cache import build_image, push_image

    address, tag = request.address_and_tag()
    if bool(request.runtime_image) != bool(request.model_uri):
        raise PrebakeError("--runtime-image and --model-uri go together: KServe's footprint needs both")
    recipe = load_recipe(request.model)
    if recipe.model.engine != "vllm":
        raise PrebakeError(
            f"recipe {request.model} is for the {recipe.model.engine} engine; kernel-cache images hold vLLM's "
            f"compile cache: name a recipe with engine = 'vllm' (prebake recipes lists them)"
        )
    context = open_context()
    plan = context.pick_plan(recipe, dtype=request.precision, tp=request.tp)
    with context.holds:
        resolution = context.resolve(plan, kinds=["graphs"])
        if "graphs" not in resolution.installed:
            return NotBaked(request.model, tuple(resolution.misses))
        installed = resolution.installed["graphs"]
        ranks = checked_ranks(installed, plan.target.tp)
        scratch = context.store.scratch(f"kernel-cache-{installed.manifest.key_digest[:16]}")
        try:
            image = build_image(
                read_cache_tree(installed.tree, installed.manifest, request.cache_path),
                installed.manifest,
                scratch,
                runtime_image=request.runtime_image,
                model_uri=request.model_uri,
                ranks=ranks,
            )
            digest = push_image(image, address, tag)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    where = address.removeprefix("oci://")
    return Pushed(
        image=f"{where}@{digest}",
        tag=f"{where}:{tag}",
        target=plan.target.name,
        key=installed.manifest.key_digest,
        labels=dict(image.labels),
        factors=dict(image.factors),
        footprint=image.compatibility_footprint,
        ranks=ranks,
    )


def checked_ranks(installed: Installed, tp: int) -> tuple[int, ...]:
    """The ranks 0..tp-1, once the installed tree is checked to hold each one's compile cache
    (prebake.engine.vllm.ranks); an image a rank could not start from is refused, the rank named."""
    from prebake.engine.vllm.process import CACHE_DIR, read_report
    from prebake.engine.vllm.ranks import describe_gaps, gaps

    found = gaps(installed.tree / CACHE_DIR, tp, read_report(installed.tree).get("ranks"))
    if found:
        bake = bake_command(installed.manifest.labels.get("model") or "...", tp=tp)
        raise PrebakeError(
            f"graphs {installed.manifest.key_digest[:16]} is baked for tp={tp}, but {describe_gaps(found)}; "
            f"no kernel-cache image is made from it: rebake it ({bake}) and push again"
        )
    return tuple(range(tp))
