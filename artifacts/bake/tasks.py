"""doit task dictionaries for `doit bake`: one task per (target, artifact kind).

    bake:<model>/<platform>/tp<N>/<dtype>:buckets
    bake:<model>/<platform>/tp<N>/<dtype>:autotune   (after buckets)
    bake:<model>/<platform>/tp<N>/<dtype>:graphs     (after buckets and autotune)

The tasks and their order come from the target's kind table (each task depends on its kind's
upstream kinds). Each task is up to date when the registry already answers its key, which
costs one index read and no torch import: re-running a bake with nothing changed does nothing.
Problems found while planning (unknown model, a precision this host cannot build) become one
failing task that says so, so `doit list` keeps working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from doit.exceptions import TaskFailed

from prebake.artifacts.bake.kinds import TargetKeys
from prebake.artifacts.bake.recipes import Recipe, list_recipes, load_recipe
from prebake.artifacts.errors import PrebakeError, RecipeError
from prebake.artifacts.ports.registry import Registry


@dataclass(frozen=True)
class BakeRequest:
    """The variables of `doit bake`: model=, precision=, tp=, registry=."""

    model: str | None
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None


class Baker(Protocol):
    """What the tasks need from the composition root (prebake.engine.compose.Context satisfies this)."""

    @property
    def registry(self) -> Registry: ...

    def plans(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> list[TargetKeys]: ...

    def bake(self, plan: TargetKeys, kind: str) -> Any: ...


def bake_tasks(request: BakeRequest, *, open_baker: Callable[[str | None], Baker]) -> Iterator[dict[str, Any]]:
    """The bake task of every kind of every target of the request that this host can build."""
    try:
        if not request.model:
            raise RecipeError(f"say which model to bake: doit bake model=<name>; recipes: {', '.join(list_recipes())}")
        recipe = load_recipe(request.model)
        baker = open_baker(request.registry)
        targets = baker.plans(recipe, dtype=request.precision, tp=request.tp)
        opened = baker.registry
    except PrebakeError as exc:
        yield _failing_task(str(exc))
        return
    for p in targets:
        for kind in p.kinds:
            key = p.key(kind.name)
            yield {
                "name": f"{p.target.name}:{kind.name}",
                "doc": f"build {kind.name} of {p.target.name} (key {key.digest[:16]})",
                "actions": [(_run, [baker, p, kind.name])],
                "uptodate": [_published(opened, kind.name, key.digest)],
                "task_dep": [f"bake:{p.target.name}:{up}" for up in kind.upstream],
                "verbosity": 2,
            }


def _run(baker: Baker, plan: TargetKeys, kind: str) -> bool:
    baker.bake(plan, kind)
    return True


def _published(registry: Registry, kind: str, key_digest: str) -> Callable[[], bool]:
    def check() -> bool:
        return registry.lookup(kind, key_digest) is not None

    return check


def _failing_task(message: str) -> dict[str, Any]:
    def fail() -> TaskFailed:
        return TaskFailed(message)

    return {"name": "error", "doc": "explains why nothing can be baked", "actions": [fail], "verbosity": 2}
