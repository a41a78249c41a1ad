"""The local executor: `prebake bake` runs the very tasks of `doit bake`, through doit's own API.

A ModuleTaskLoader hands doit one task generator, `task_bake`, which yields
prebake.artifacts.bake.tasks.bake_tasks for this host; DoitMain runs it as `doit run bake` would, with
its dependency database in $PREBAKE_HOME, so an installed wheel bakes outside a checkout
(no dodo.py, no pyproject.toml read from the working folder).
"""

from __future__ import annotations

from collections.abc import Sequence

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain

from prebake.artifacts.bake.fleet_plan import matches
from prebake.artifacts.bake.tasks import BakeRequest, bake_tasks
from prebake.artifacts.errors import HostCannotBuildError, RecipeError
from prebake.artifacts.recipe.schema import Recipe, Target, targets
from prebake.artifacts.store.local import Store
from prebake.engine.common.probe import current_host
from prebake.engine.compose import Context


def bake_locally(request: BakeRequest, *, doit_args: Sequence[str] = ()) -> int:
    """Run every bake task of the request on this host; doit's exit status (0 when all are done)."""
    store = Store()

    def task_bake():
        """Bake a recipe for this host: buckets -> autotune -> graphs, each packed, published and installed."""
        yield from bake_tasks(request, open_baker=lambda registry: Context.for_baking(registry, store=store))

    store.home.mkdir(parents=True, exist_ok=True)
    namespace = {
        "task_bake": task_bake,
        "DOIT_CONFIG": {
            "backend": "sqlite3",  # tolerates several bakers sharing one home
            "dep_file": str(store.home / "doit.db"),
            "default_tasks": ["bake"],
            "verbosity": 2,
        },
    }
    return DoitMain(ModuleTaskLoader(namespace), config_filenames=()).run(["run", *doit_args, "bake"])


def parse_target(recipe: Recipe, target_id: str) -> Target:
    """The recipe's target named `target_id` ("<model>/<platform>/tp<N>/<dtype>", as `prebake plan` prints)."""
    known = targets(recipe)
    found = next((t for t in known if t.name == target_id), None)
    if found is None:
        sample = ", ".join(t.name for t in known[:3])
        raise RecipeError(
            f"target {target_id!r} is not in recipe {recipe.model.name}'s matrix; "
            f"use an id from `prebake plan --model {recipe.model.name}` (such as {sample})"
        )
    return found


def request_for_target(model: str, target: Target, registry: str | None) -> BakeRequest:
    """The bake request of exactly one target, refused on a host of another platform."""
    host = current_host()
    if not matches(target, host):
        raise HostCannotBuildError(
            f"target {target.name} builds on a {target.platform} host; this host is "
            f"{host.platform.describe()}: run it on a runner with that platform"
        )
    return BakeRequest(model=model, precision=target.dtype, tp=target.tp, registry=registry)
