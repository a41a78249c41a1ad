"""FP8 graphs in the aoti-package: a 2-layer recipe's fp8 step shapes compiled by AOTInductor (W8A8
through torch._scaled_mm) pick the same greedy tokens as the fp8 eager runtime, step by step on the
eager run's tokens (a random model's free-running generation amplifies bf16 rounding into other
tokens; teacher forcing compares each step's compute alone), with logits equal to bf16 rounding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.serving import write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

_COMPILE = """
import sys
from pathlib import Path
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import compile_graphs, model_and_cache
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic
recipe, out = load_recipe(sys.argv[1]), Path(sys.argv[2])
shapes = [StepShape("prefill", 1, 8, 8), StepShape("decode", 1, 1, 32)]
compile_graphs(*model_and_cache(recipe, "fp8"), recipe, {s: Tactic() for s in shapes}, out, workers=1)
"""

# greedy tokens of one prompt, from the package and from the eager runtime, on the same shapes
_GENERATE = """
import json, sys
from pathlib import Path
import torch
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime import aoti
from prebake.engine.bundled.runtime.fp8_linear import is_fp8
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
recipe, tree = load_recipe(sys.argv[1]), Path(sys.argv[2])
shapes = [StepShape("prefill", 1, 8, 8), StepShape("decode", 1, 1, 32)]
model, cache = model_and_cache(recipe, "fp8")
package = aoti.load_package(model, cache, shapes, tree)
eager = CompiledSteps(*model_and_cache(recipe, "fp8"), compile=False)
def run(steps, forced):
    # greedy tokens and each step's logits; `forced`: feed these tokens instead (teacher forcing)
    ids = torch.tensor([[5, 17, 300, 42, 7, 0, 0, 0]])
    logits = [steps.prefill(ids, torch.tensor([5]), torch.tensor([0]), Tactic())[0]]
    out = [int(logits[-1].argmax())]
    for i, position in enumerate(range(5, 15)):
        fed = out[-1] if forced is None else forced[i]
        logits.append(steps.decode(torch.tensor([fed]), torch.tensor([position]), torch.tensor([0]), 32, Tactic())[0])
        out.append(int(logits[-1].argmax()))
    return out, torch.stack(logits)
want, want_logits = run(eager, None)
for c in (*package.cache.keys, *package.cache.values):
    c.zero_()
got, got_logits = run(package, want)
relative = float((got_logits - want_logits).abs().max() / want_logits.abs().max())
print(json.dumps({"package": got, "eager": want, "relative": relative, "fp8": is_fp8(model)}))
"""


def test_fp8_package_tokens_equal_the_fp8_eager_runtimes(tmp_path):
    recipes, tree = tmp_path / "recipes", tmp_path / "graphs"
    write_recipe(recipes, "fp8-test", variant="aoti-package", seqs=1, dtype="fp8")
    tree.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(tree / "inductor")}
    recipe = str(recipes / "fp8-test.toml")
    subprocess.run([sys.executable, "-c", _COMPILE, recipe, str(tree)], env=env, check=True, timeout=900)
    proc = subprocess.run(
        [sys.executable, "-c", _GENERATE, recipe, str(tree)], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # the same tokens fed to both (the eager run's greedy ones): each step's greedy pick and logits agree
    assert report["fp8"] and report["package"] == report["eager"], report
    assert report["relative"] < 0.03, report
