"""doit task dictionaries for `doit bake`: one task per (target, artifact kind).

    bake:<model>/<platform>/tp<N>/<dtype>:<kind>   buckets, then autotune, then graphs (the kind table's order)

A task is up to date when the registry already answers its key with an entry the trust policy
accepts: one index read, no torch import, so a bake with nothing changed does nothing. A planning
problem (unknown model, a precision this host cannot build) becomes one failing task that says
so, so `doit list` keeps working. `request_from_variables` checks doit's `name=value` arguments
against BAKE_VARIABLES first, so a typo (`precison=bf16`) is refused, naming the nearest.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from doit.exceptions import TaskFailed

from prebake.artifacts.errors import MissingExtraError, PrebakeError, RecipeError, StoreError, UsageError
from prebake.artifacts.fetch.gate import accepted_entry
from prebake.artifacts.ports.registry import Registry, TrustCheck
from prebake.artifacts.recipe.catalog import list_recipes
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.recipe.schema import Recipe, load_recipe
from prebake.artifacts.store.home import check_home
from prebake.artifacts.store.settings import default_home


@dataclass(frozen=True)
class BakeRequest:
    """The variables of `doit bake`: model=, precision=, tp=, registry=."""

    model: str | None
    precision: str | None = None
    tp: int | None = None
    registry: str | None = None


# The variables `doit bake` takes, each with what it means (shown by `doit help bake` / `doit list`).
BAKE_VARIABLES: dict[str, str] = {
    "model": "recipe name (required): recipes/<name>.toml, found as `prebake recipes` lists",
    "precision": "only this dtype (default: every dtype of the matrix this host builds)",
    "tp": "only this tensor-parallel size, a whole number (default: every size of the matrix)",
    "registry": "where to publish: a registry address, any form `prebake bake --registry` takes "
    "(default: PREBAKE_REGISTRY, else $PREBAKE_HOME/registry)",
}
BAKE_DOC = "Bake a recipe for this host (variables: model=<recipe> [precision=<dtype>] [tp=<N>] [registry=<address>])"


def request_from_variables(variables: Mapping[str, str]) -> BakeRequest:
    """The bake request of doit's command-line variables; UsageError for an unknown or malformed one."""
    unknown = sorted(set(variables) - set(BAKE_VARIABLES))
    if unknown:
        name = unknown[0]
        near = difflib.get_close_matches(name, list(BAKE_VARIABLES), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}=? " if near else ""
        raise UsageError(
            f"doit bake takes no variable {name}= ({hint}it takes {', '.join(f'{v}=' for v in BAKE_VARIABLES)}); "
            f"fix the spelling and run it again (see `doit help bake`)"
        )
    empty = [name for name, value in variables.items() if name != "registry" and not str(value).strip()]
    if empty:
        raise UsageError(f"doit bake variable {empty[0]}= is empty; give it a value or leave it out")
    tp_text = variables.get("tp")
    tp: int | None = None
    if tp_text is not None:
        try:
            tp = int(tp_text)
        except ValueError:
            raise UsageError(
                f"doit bake tp={tp_text!r} is not a whole number; write the tensor-parallel size, e.g. tp=1"
            ) from None
        if tp < 1:
            raise UsageError(f"doit bake tp={tp} must be 1 or more")
    return BakeRequest(
        model=variables.get("model"),
        precision=variables.get("precision"),
        tp=tp,
        registry=variables.get("registry") or None,
    )


def doit_variables() -> dict[str, str]:
    """Every `name=value` on doit's command line. doit has no public call that lists them (its
    get_var answers one name at a time), so this reads the dict get_var reads."""
    from doit import doit_cmd

    return dict(doit_cmd._CMDLINE_VARS or {})


def variable_tasks(
    variables: Mapping[str, str], *, open_baker: Callable[[str | None], Baker]
) -> Iterator[dict[str, Any]]:
    """`doit bake`'s tasks for its command-line variables: one failing task if a variable is wrong."""
    try:
        request = request_from_variables(variables)
        check_home(default_home(), write=True)  # the bake installs and records in the store
    except (UsageError, StoreError) as exc:
        yield {"name": None, "doc": BAKE_DOC}
        yield _failing_task(str(exc))
        return
    yield from bake_tasks(request, open_baker=open_baker)


class Baker(Protocol):
    """What the tasks need from the composition root (prebake.engine.compose.Context satisfies this)."""

    @property
    def registry(self) -> Registry: ...

    @property
    def trust(self) -> TrustCheck | None: ...

    def plans(self, recipe: Recipe, *, dtype: str | None = None, tp: int | None = None) -> list[TargetKeys]: ...

    def bake(self, plan: TargetKeys, kind: str) -> Any: ...


def bake_tasks(request: BakeRequest, *, open_baker: Callable[[str | None], Baker]) -> Iterator[dict[str, Any]]:
    """The bake task of every kind of every target of the request that this host can build."""
    yield {"name": None, "doc": BAKE_DOC}
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
                "uptodate": [_published(opened, kind.name, key.digest, baker.trust)],
                "task_dep": [f"bake:{p.target.name}:{up}" for up in kind.upstream],
                "verbosity": 2,
            }


def _run(baker: Baker, plan: TargetKeys, kind: str) -> bool | TaskFailed:
    try:
        baker.bake(plan, kind)
    except MissingExtraError as exc:  # a missing extra is one line naming it, not a traceback
        return TaskFailed(str(exc))
    return True


def _published(registry: Registry, kind: str, key_digest: str, trust: TrustCheck | None) -> Callable[[], bool]:
    def check() -> bool:  # an entry the policy in force refuses is not up to date: the bake says why
        return accepted_entry(registry, kind, key_digest, trust) is not None

    return check


def _failing_task(message: str) -> dict[str, Any]:
    def fail() -> TaskFailed:
        return TaskFailed(message)

    return {"name": "error", "doc": "explains why nothing can be baked", "actions": [fail], "verbosity": 2}
