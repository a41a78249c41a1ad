"""The fleet plan: every target of a recipe's matrix, per kind present, missing, unknown or unbuildable.

A target's keys depend on its builder's platform and software, which a planner elsewhere cannot
probe, so each target is keyed from a profile: a declared one for its platform, else this host
when the platforms match, else none (then host-independent kinds are still looked up exactly and
the others are `unknown`, for a builder to decide on its own hardware). `present` means the exact
key is in the registry with an entry the trust policy accepts (`published`); a key is never
guessed from another host. Planning reads one index entry per target and kind and never lists the
registry, so its time grows with the targets, not the registry. docs/fleet.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from prebake.artifacts.recipe.kinds import HostFacts, KindTable, target_keys
from prebake.artifacts.recipe.schema import Recipe, Target, parse_platform
from prebake.artifacts.tables import table

PRESENT, MISSING, UNKNOWN, UNBUILDABLE = "present", "missing", "unknown", "unbuildable"
PLAN_SCHEMA = "prebake.plan/1"  # the version of `prebake plan --json`'s shape
STATUSES = (PRESENT, MISSING, UNKNOWN, UNBUILDABLE)
_LOOKUP_THREADS = 8
KindsFor = Callable[[Recipe, Target], KindTable]  # a target's kind table (prebake.engine.adapters.kinds_for)


@dataclass(frozen=True)
class Profile:
    """The facts of one class of builder: its host facts and how to reach one (runner labels)."""

    name: str
    host: HostFacts
    runner_labels: tuple[str, ...] = ()

    def platform_string(self) -> str:
        p = self.host.platform
        return p.arch if p.device == "gaudi" else f"cuda:{p.arch}" if p.device == "cuda" else "cpu"


@dataclass(frozen=True)
class Requirement:
    """What a builder of one target needs: its platform, accelerators (= TP) and where to find one."""

    platform: str
    device: str
    arch: str
    accelerators: int
    runner_labels: tuple[str, ...]
    custom_resource: str
    device_name: str = ""  # the profile's device (GPU model), when a profile keyed the target

    def ray_resources(self) -> dict[str, float]:
        """The Ray custom resource a matching node advertises (see `prebake ray-resources`): one
        unit per accelerator the bake uses (TP), one per bake on a CPU node."""
        return {self.custom_resource: float(max(1, self.accelerators))}

    def describe(self) -> str:
        """The NEEDS column of `prebake plan`: device and arch, times the accelerators when any."""
        where = f"{self.device} {self.arch}".strip()
        return f"{where} x{self.accelerators}" if self.accelerators else where


@dataclass(frozen=True)
class KindState:
    kind: str
    status: str
    key_digest: str | None = None


@dataclass(frozen=True)
class TargetPlan:
    """One target of the matrix: its requirement, the profile that keyed it, and each kind's state."""

    target: Target
    requirement: Requirement
    profile: str | None
    kinds: tuple[KindState, ...]
    buildable_here: bool
    reason: str = ""

    @property
    def id(self) -> str:
        return self.target.name

    @property
    def status(self) -> str:
        """unbuildable, else missing if any kind is, else unknown if any kind is, else present."""
        states = {k.status for k in self.kinds}
        for status in (UNBUILDABLE, MISSING, UNKNOWN):
            if status in states:
                return status
        return PRESENT

    @property
    def needs_bake(self) -> bool:
        return self.status in (MISSING, UNKNOWN)

    def to_json(self) -> dict[str, object]:
        """One target of `prebake plan --json`."""
        need = self.requirement
        return {
            "id": self.id,
            "platform": self.target.platform,
            "tp": self.target.tp,
            "dtype": self.target.dtype,
            "status": self.status,
            "profile": self.profile,
            "reason": self.reason,
            "buildable_here": self.buildable_here,
            "requires": {
                "device": need.device,
                "arch": need.arch,
                "accelerators": need.accelerators,
                "runner_labels": list(need.runner_labels),
                "ray_resources": need.ray_resources(),
            },
            "kinds": {k.kind: {"status": k.status, "key": k.key_digest} for k in self.kinds},
        }


@dataclass(frozen=True)
class FleetPlan:
    recipe: str
    registry: str
    targets: tuple[TargetPlan, ...] = field(default_factory=tuple)

    def missing(self) -> tuple[TargetPlan, ...]:
        return tuple(t for t in self.targets if t.needs_bake)

    def find(self, target_id: str) -> TargetPlan | None:
        return next((t for t in self.targets if t.id == target_id), None)

    def to_json(self, rows: Sequence[TargetPlan], *, here: str) -> dict[str, object]:
        """`prebake plan --json` of `rows` (every target, or the missing ones), as seen from `here`."""
        return {
            "schema": PLAN_SCHEMA,
            "recipe": self.recipe,
            "registry": self.registry,
            "here": here,
            "targets": [t.to_json() for t in rows],
        }

    def render(self, rows: Sequence[TargetPlan]) -> str:
        """`prebake plan`'s table of `rows`: a line per target, its kinds' states, then the counts and
        why the unknown and unbuildable ones are so (the first eight)."""
        kinds = [k.kind for k in rows[0].kinds] if rows else []
        headers = ("TARGET", "STATUS", *(k.upper() for k in kinds), "NEEDS", "RUNNER LABELS", "PROFILE", "HERE")
        body = [
            (
                t.id,
                t.status,
                *(k.status for k in t.kinds),
                t.requirement.describe(),
                ",".join(t.requirement.runner_labels),
                t.profile or "-",
                "yes" if t.buildable_here else "no",
            )
            for t in rows
        ]
        counts = {s: sum(1 for t in rows if t.status == s) for s in STATUSES}
        summary = f"{self.recipe} against {self.registry}: {len(rows)} targets x {len(kinds)} kinds; " + ", ".join(
            f"{n} {s}" for s, n in counts.items() if n
        )
        notes = sorted({f"  {t.id}: {t.reason}" for t in rows if t.reason and t.status in (UNKNOWN, UNBUILDABLE)})
        return "\n".join([table(headers, body) if body else "no targets", summary, *notes[:8]])


def github_matrix(rows: Sequence[TargetPlan]) -> dict[str, object]:
    """A GitHub Actions matrix: {"include": [{target, model, platform, tp, dtype, runner, accelerators}]}."""
    return {
        "include": [
            {
                "target": t.id,
                "model": t.target.recipe,
                "platform": t.target.platform,
                "tp": t.target.tp,
                "dtype": t.target.dtype,
                "runner": ["self-hosted", *t.requirement.runner_labels],
                "accelerators": t.requirement.accelerators,
            }
            for t in rows
            if t.status != UNBUILDABLE
        ]
    }


def plan_fleet(
    recipe: Recipe,
    wanted: Sequence[Target],
    *,
    here: HostFacts,
    profiles: Sequence[Profile],
    published: Callable[[str, str], bool],
    kinds_for: KindsFor,
    registry: str = "",
    host_independent: Iterable[str] | None = None,
    refuses: Callable[[Recipe, Target], str | None] = lambda recipe, target: None,
) -> FleetPlan:
    """TargetKeys every wanted target: keys from its profile, one index lookup per known key; a
    target its engine `refuses` (why, or None) is unbuildable everywhere, with that reason.

    `published(kind, key_digest)` answers from the registry's index; it is called from a few
    threads at once, so a remote registry's round trips overlap.
    """
    independent = set(
        host_independent if host_independent is not None else host_independent_kinds(recipe, here, kinds_for)
    )
    drafts = [_draft(recipe, t, here, profiles, independent, kinds_for(recipe, t), refuses(recipe, t)) for t in wanted]
    queries = sorted({(k.kind, k.key_digest) for d in drafts for k in d.kinds if k.key_digest})
    with ThreadPoolExecutor(max_workers=_LOOKUP_THREADS) as pool:
        answers = dict(zip(queries, pool.map(lambda q: published(*q), queries)))
    return FleetPlan(recipe.model.name, registry, tuple(_settle(d, answers) for d in drafts))


def host_independent_kinds(recipe: Recipe, here: HostFacts, kinds_for: KindsFor) -> frozenset[str]:
    """Kinds whose key is the same whatever host builds them: keyed under two hosts that differ
    in every platform and software factor, they come out equal."""
    target = Target(recipe.model.name, "cpu", recipe.matrix.tp[0], recipe.matrix.dtype[0])
    kinds = kinds_for(recipe, target)
    a, b = (
        target_keys(recipe, target, _Stranger(here, "a"), kinds),
        target_keys(recipe, target, _Stranger(here, "b"), kinds),
    )
    return frozenset(kind for kind in kinds.names if a.key(kind).digest == b.key(kind).digest)


def requirement(target: Target, profile: Profile | None) -> Requirement:
    device, arch = parse_platform(target.platform)
    slug = target.platform.replace(":", "-")
    labels = profile.runner_labels if profile and profile.runner_labels else (f"prebake-{slug}",)
    return Requirement(
        platform=target.platform,
        device=device,
        arch=arch,
        accelerators=0 if device == "cpu" else target.tp,
        runner_labels=tuple(labels),
        custom_resource=custom_resource(target.platform),
        device_name=profile.host.platform.factors().get("device_name", "") if profile else "",
    )


def custom_resource(platform: str) -> str:
    """The Ray resource a node of this matrix platform advertises: "prebake-cuda-sm_90", "prebake-cpu"."""
    return "prebake-" + platform.replace(":", "-")


def ray_resource(device: str, arch: str, device_count: int) -> dict[str, int]:
    """What a node of this platform passes to `ray start --resources`: its resource and how many."""
    platform = "cpu" if device == "cpu" else f"cuda:{arch}" if device == "cuda" else arch
    return {custom_resource(platform): 1 if device == "cpu" else device_count}


def matches(target: Target, host: HostFacts) -> bool:
    device, arch = parse_platform(target.platform)
    return host.platform.device == device and (not arch or host.platform.arch == arch)


# --- steps -------------------------------------------------------------------------------------


def _draft(
    recipe: Recipe,
    target: Target,
    here: HostFacts,
    profiles: Sequence[Profile],
    independent: set[str],
    kinds: KindTable,
    refused: str | None,
) -> TargetPlan:
    profile = next((p for p in profiles if matches(target, p.host)), None)
    if profile is None and matches(target, here):
        profile = Profile("this host", here)
    need = requirement(target, profile)
    if refused is not None:  # the engine builds it nowhere
        states = tuple(KindState(kind, UNBUILDABLE) for kind in kinds.names)
        return TargetPlan(target, need, profile.name if profile else None, states, False, refused)
    buildable_here = matches(target, here) and here.can_build(parse_platform(target.platform)[0], target.dtype)[0]
    if profile is not None:
        ok, why = profile.host.can_build(need.device, target.dtype)
        if not ok:
            states = tuple(KindState(kind, UNBUILDABLE) for kind in kinds.names)
            return TargetPlan(target, need, profile.name, states, buildable_here, why)
        keys = target_keys(recipe, target, profile.host, kinds).keys
        states = tuple(KindState(kind, MISSING, keys[kind].digest) for kind in kinds.names)
        return TargetPlan(target, need, profile.name, states, buildable_here)
    keys = target_keys(recipe, target, _Stranger(here, "x"), kinds).keys
    states = tuple(
        KindState(kind, MISSING, keys[kind].digest) if kind in independent else KindState(kind, UNKNOWN)
        for kind in kinds.names
    )
    why = f"no profile for {target.platform}: declare one (prebake profile on such a runner) to plan its keys"
    return TargetPlan(target, need, None, states, buildable_here, why)


def _settle(draft: TargetPlan, answers: dict[tuple[str, str], bool]) -> TargetPlan:
    states = tuple(
        KindState(k.kind, PRESENT, k.key_digest) if k.key_digest and answers[(k.kind, k.key_digest)] else k
        for k in draft.kinds
    )
    return TargetPlan(draft.target, draft.requirement, draft.profile, states, draft.buildable_here, draft.reason)


@dataclass(frozen=True)
class _StrangerPart:
    facts: dict[str, str]
    device: str = "cpu"
    arch: str = ""
    marker: str = ""

    def factors(self) -> dict[str, str]:
        return dict(self.facts)

    def package_factors(self, names: Sequence[str]) -> dict[str, str]:
        return {name: f"{self.marker}-{name}" for name in names}


class _Stranger:
    """A made-up host whose every platform and software factor carries a marker: keys that do
    not change under it do not depend on the host."""

    def __init__(self, like: HostFacts, marker: str):
        self.platform = _StrangerPart({k: f"{marker}-{v}" for k, v in like.platform.factors().items()})
        self.software = _StrangerPart({k: f"{marker}-{v}" for k, v in like.software.factors().items()}, marker=marker)

    def can_build(self, device: str, dtype: str) -> tuple[bool, str]:
        return True, ""  # keys only: a stranger is never asked to build
