"""doit task dictionaries for `doit bake`: one task per (target, artifact kind).

    bake:<model>/<platform>/tp<N>/<dtype>:buckets
    bake:<model>/<platform>/tp<N>/<dtype>:autotune   (after buckets)
    bake:<model>/<platform>/tp<N>/<dtype>:graphs     (after autotune)

Each task is up to date when the registry already answers its key, which costs one
index read and no torch import: re-running a bake with nothing changed does nothing.
Problems found while planning (unknown model, a precision this host cannot build)
become one failing task that says so, so `doit list` keeps working.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .errors import PrebakeError, RecipeError
from .kinds import KINDS, Plan, plans_for_host
from .recipes import Recipe, list_recipes, load_recipe


@dataclass(frozen=True)
class BakeRequest:
    """The variables of `doit bake`: model=, precision=, tp=, registry=."""

    model: str | None
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None


def bake_tasks(request: BakeRequest, *, host, store, open_registry: Callable, run_kind: Callable) -> Iterator[dict]:
    """The bake task of every kind of every target of the request that this host can build."""
    try:
        recipe, plans = _plans(request, host)
        registry = open_registry(store.registry_address(request.registry))
    except PrebakeError as exc:
        yield _failing_task(str(exc))
        return
    for p in plans:
        for i, kind in enumerate(KINDS):
            key = p.key(kind)
            yield {
                "name": f"{p.target.name}:{kind}",
                "doc": f"build {kind} of {p.target.name} (key {key.digest[:16]})",
                "actions": [(run_kind, [p, kind, registry])],
                "uptodate": [_published(registry, kind, key.digest)],
                "task_dep": [f"bake:{p.target.name}:{KINDS[i - 1]}"] if i else [],
                "verbosity": 2,
            }


def _plans(request: BakeRequest, host) -> tuple[Recipe, list[Plan]]:
    if not request.model:
        raise RecipeError(f"say which model to bake: doit bake model=<name>; recipes: {', '.join(list_recipes())}")
    recipe = load_recipe(request.model)
    return recipe, plans_for_host(recipe, host, dtype=request.precision, tp=request.tp)


def _published(registry, kind: str, key_digest: str) -> Callable[[], bool]:
    def check() -> bool:
        return registry.lookup(kind, key_digest) is not None

    return check


def _failing_task(message: str) -> dict:
    def fail():
        from doit.exceptions import TaskFailed

        return TaskFailed(message)

    return {"name": "error", "doc": "explains why nothing can be baked", "actions": [fail], "verbosity": 2}
