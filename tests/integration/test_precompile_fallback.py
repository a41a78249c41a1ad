"""The dynamo-precompile graphs variant (named: the default is aoti-package): a precompiled function that does
not load falls back to the Inductor cache of the same graphs tree, says why, and computes the same thing.

Real torch.compile in fresh processes (one per phase, as a baker and a server are), on one decode
shape of the serving tests' two-layer recipe (tests/support/serving.py), so each compile is as
short as it gets: the subject is the fallback, not the model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.serving import write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import json, sys
from pathlib import Path
from torch._dynamo.utils import counters
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import compile_graphs, model_and_cache
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic
from prebake.engine.bundled.start import StartupPhaseLog
from prebake.engine.bundled.variants.base import LoadJob
from prebake.engine.bundled.warm_up import GraphsTree, WarmUp

phase, tree, recipe = sys.argv[1], Path(sys.argv[2]), load_recipe(Path(sys.argv[3]))
model, cache = model_and_cache(recipe, "fp32")
tactics = {StepShape("decode", 1, 1, 32): Tactic()}
if phase == "build":
    steps, reason = compile_graphs(model, cache, recipe, tactics, tree, log=lambda line: None), None
else:  # the start's warm-up: the variants' chain from dynamo-precompile, the tree writable where it lies
    lines = []
    log = StartupPhaseLog(Metrics(), lines.append)
    warm = WarmUp(log, GraphsTree(None, tree, path=tree, private=True))
    loaded = warm.graphs("dynamo-precompile", lambda t: LoadJob(model, cache, "default", tuple(tactics), t, log.note))
    steps, reason = loaded.steps, next((line for line in lines if "do not load here" in line), None)
out = steps.run_dummy(*next(iter(tactics.items())))
hits = {k: counters["aot_autograd"][k] for k in ("autograd_cache_hit", "autograd_cache_miss")}
print(json.dumps({"kind": type(steps).__name__, "reason": reason, "sum": float(out.double().sum()), **hits}))
"""


def _run(phase: str, tree: Path, recipe: Path) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tree / "inductor"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, phase, str(tree), str(recipe)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_precompiled_function_that_does_not_load_falls_back_to_the_same_trees_inductor_cache(tmp_path):
    write_recipe(tmp_path / "recipes", "fallback-test", variant="dynamo-precompile", seqs=1)
    recipe = tmp_path / "recipes" / "fallback-test.toml"
    baked = tmp_path / "baked"
    built = _run("build", baked, recipe)
    intact, broken = tmp_path / "intact", tmp_path / "broken"
    shutil.copytree(baked, intact)
    shutil.copytree(baked, broken)
    (function,) = (broken / "aot").iterdir()
    assert json.loads((baked / "graphs.json").read_text())["precompiled"] is True
    function.write_bytes(function.read_bytes()[:100])  # verified bytes that do not load: here, cut short

    loaded = _run("load", intact, recipe)
    fallback = _run("load", broken, recipe)

    assert loaded["kind"] == "AotSteps" and loaded["reason"] is None
    assert fallback["kind"] == "CompiledSteps" and fallback["reason"]  # the reason the engine logs
    assert fallback["autograd_cache_hit"] >= 1 and fallback["autograd_cache_miss"] == 0, fallback
    assert loaded["sum"] == pytest.approx(built["sum"]) and fallback["sum"] == pytest.approx(built["sum"], rel=1e-4)
