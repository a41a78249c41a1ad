"""A toy engine, whole in this file: its own software factor (the `toy-runtime` package), its own
recipe setting ([engine] flavour), one compiled kind and one start option of its own
(--mem-fraction-static), declared in its EngineSpec, and a process
that serves from it through the shared starter (prebake.engine.common.starter). tests/integration/test_toy_engine.py
registers it with one line, `register(ToyEngine())`, and touches no other file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.frozen import Frozen
from prebake.artifacts.recipe.kinds import (
    BUCKETS_FILE,
    Builder,
    BuildRequest,
    Groups,
    KeyContext,
    Kind,
    TargetKeys,
    target_groups,
)
from prebake.artifacts.recipe.schema import Recipe
from prebake.artifacts.store.local import Installed
from prebake.engine.common import starter
from prebake.engine.common.adapter import (
    EngineOption,
    EngineSpec,
    EngineStartError,
    Fetched,
    OpenServices,
    Services,
    StartRequest,
    recipe_settings,
)
from prebake.engine.common.probe import Package

CACHE_FILE = "toy-cache.json"
PACKAGE = Package("toy_runtime", ("toy-runtime",), "pkg:pypi/toy-runtime", dependency="toy-runtime")
# The toy server: serves from the cache the starter pointed it at; on a miss it "compiles" one
# first (as an engine compiles what it did not find); says what it serves, and exits.
SERVER = """
import json, os, pathlib
cache = pathlib.Path(os.environ['TOY_CACHE_DIR']) / 'toy-cache.json'
if not cache.is_file():
    cache.write_text(json.dumps({'flavour': 'compiled-in-place', 'decode_buckets': 0}, sort_keys=True))
print('toy serving', cache.read_text(), 'mem', os.environ.get('TOY_MEM_FRACTION', 'default'), flush=True)
"""


class ToySettings(Frozen):
    flavour: str = "plain"


def _settings(recipe: Recipe) -> ToySettings:
    settings = recipe_settings(recipe, "toy", ToySettings)
    assert isinstance(settings, ToySettings)
    return settings


def _cache_groups(context: KeyContext) -> Groups:
    return {
        **target_groups(context, software=(PACKAGE.factor,)),
        "toy": _settings(context.recipe).model_dump(mode="json"),
    }


def _build_cache(request: BuildRequest) -> None:
    buckets = json.loads((request.inputs["buckets"] / BUCKETS_FILE).read_text())
    document = {"flavour": _settings(request.plan.recipe).flavour, "decode_buckets": len(buckets["decode"])}
    (request.out / CACHE_FILE).write_text(json.dumps(document, sort_keys=True))


CACHE = Kind("toycache", ("buckets",), _cache_groups, (CACHE_FILE,), _build_cache)


class ToyEngine:
    spec = EngineSpec(
        name="toy",
        kinds=(CACHE,),
        fallback_kind="toycache",
        variants={"inductor-cache": ()},
        packages=(PACKAGE,),
        settings=ToySettings,
        options=(  # SGLang's flag: the share of memory its KV cache takes; the CLI builds the flag from it
            EngineOption("--mem-fraction-static", "the share of memory its KV cache takes (SGLang's)", type=float),
        ),
    )

    def serve_environment(self, plan: TargetKeys, installed: Mapping[str, Installed], run_dir: Path) -> dict[str, str]:
        private = run_dir / "cache"
        if "toycache" in installed:
            shutil.copytree(installed["toycache"].tree, private, dirs_exist_ok=True)
        private.mkdir(parents=True, exist_ok=True)
        return {"TOY_CACHE_DIR": str(private)}

    def fetch(self, request: StartRequest, services: Services) -> Fetched:
        self.spec.options_of(request)
        prepared = starter.prepare(self.serve_environment, request, services)
        return starter.fetched(prepared, self.launch(prepared, request, services))

    def serve(self, request: StartRequest, open_services: OpenServices) -> int:
        self.spec.options_of(request)
        emit = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
        return starter.serve(starter.Process(self, self, emit), request, open_services)

    # -- what differs from every other engine started as a process (starter.EngineProcess) -------

    def launch(self, prepared: starter.Prepared, request: StartRequest, services: Services) -> starter.Launch:
        fraction = self.spec.options_of(request)["mem_fraction_static"]
        return starter.Launch((sys.executable, "-c", SERVER), {"TOY_MEM_FRACTION": str(fraction)} if fraction else {})

    def ready(self, proc: subprocess.Popen, log: Path, started: float, launch: starter.Launch) -> float:
        while "toy serving" not in (log.read_text() if log.is_file() else ""):
            if proc.poll() is not None and "toy serving" not in log.read_text():
                raise EngineStartError(f"the toy server exited with {proc.returncode} before it served")
            time.sleep(0.05)
        return time.monotonic() - started

    def capture(self, prepared: starter.Prepared, launch: starter.Launch, ready_s: float) -> Builder:
        def build(request: BuildRequest) -> None:
            found = Path(prepared.variables["TOY_CACHE_DIR"]) / CACHE_FILE
            if not found.is_file():
                raise PrebakeError("the toy server compiled nothing to write back")
            shutil.copy2(found, request.out / CACHE_FILE)

        return build
