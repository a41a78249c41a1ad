"""The aoti-package graphs variant: the engine starts from an AOTInductor package without Dynamo or
Inductor's Python, answers as eager does, and a package that does not load here falls to the next
variant its graphs tree holds (dynamo-precompile, with the opt-in [compile] fallback) or, in a tree
without one, compiles in place; either way it says why and is counted in the store's stats.

Two bakes pay for the module, each a cold `prebake serve --write-back` of a small recipe (2 step
shapes): fp32 with the opt-in fallback = "dynamo-precompile", and the default (no fallback) in bf16,
whose tree serves the bf16 equality check and the compile-in-place test.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.bundles import tampered
from tests.support.serving import ServeProcess, serve_env, write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MODEL = "serve-test-aoti"
BARE = "serve-test-aoti-bare"  # the default aoti-package recipe: no fallback in its tree
PROMPT = [5, 17, 300, 42, 7]

# `prebake serve` with a report of the modules Dynamo and Inductor's Python would have brought in:
# once the engine is started, and again at exit, after it served.
_SERVE_REPORTING_MODULES = """
import atexit, json, sys
import prebake.engine.bundled.serve as serve

WATCHED = ("torch._dynamo", "torch._inductor.lowering", "torch._inductor.codecache", "torch._inductor.select_algorithm")

def report(when):
    print("modules " + json.dumps({"when": when, **{m: m in sys.modules for m in WATCHED}}), flush=True)

real_start = serve.start
def start(*args, **kwargs):
    engine = real_start(*args, **kwargs)
    report("started")
    return engine
serve.start = start
atexit.register(report, "exit")
from prebake.engine.cli import main
sys.exit(main(sys.argv[1:]))
"""

# Runs in a fresh process: every step shape of a graphs tree through the package and eagerly, from
# the same inputs and the same KV cache; the logits, each row's greedy token and the cache written.
_COMPARE = """
import json, sys
from pathlib import Path
import torch
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime import aoti
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic

tree, dtype, recipe = Path(sys.argv[1]), sys.argv[2], load_recipe(sys.argv[3])
shapes = [StepShape(**s["shape"]) for s in json.loads((tree / "graphs.json").read_text())["shapes"]]
model, cache = model_and_cache(recipe, dtype)
steps = aoti.load_package(model, cache, shapes, tree)
loaded = {m: m in sys.modules for m in ("torch._dynamo", "torch._inductor.lowering")}
eager = CompiledSteps(*model_and_cache(recipe, dtype), compile=False)
gen = torch.Generator().manual_seed(0)
report = []
for shape in shapes:
    b, slots = shape.batch, torch.arange(shape.batch)
    ids = torch.randint(0, model.config.vocab_size, (b, shape.tokens), generator=gen)
    if shape.phase == "prefill":
        lengths = torch.randint(1, shape.tokens + 1, (b,), generator=gen)
        got, want = (s.prefill(ids, lengths, slots, Tactic()) for s in (steps, eager))
    else:
        for mine, theirs in zip((*cache.keys, *cache.values), (*eager.cache.keys, *eager.cache.values)):
            mine.copy_(torch.randn(mine.shape, generator=gen).to(mine.dtype))
            theirs.copy_(mine)
        positions = torch.randint(0, shape.ctx_len, (b,), generator=gen)
        got, want = (s.decode(ids[:, 0], positions, slots, shape.ctx_len, Tactic()) for s in (steps, eager))
    written = max(float((m.float() - t.float()).abs().max()) for m, t in zip(cache.keys, eager.cache.keys))
    report.append({
        "shape": shape.name, "max_abs": float((got - want).abs().max()), "scale": float(want.abs().max()),
        "tokens": [got.argmax(-1).tolist(), want.argmax(-1).tolist()], "cache_max_abs": written,
    })
print(json.dumps({"loaded": loaded, "report": report, "type": type(steps).__name__}))
"""


def _python(code: str, *args: str, env: dict[str, str], timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def recipes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recipes")
    # one sequence: two step shapes; the dynamo-precompile fallback the fallback tests take
    write_recipe(folder, MODEL, variant="aoti-package", seqs=1, fallback="dynamo-precompile")
    return folder


def _cold_bake(model: str, recipes: Path, registry: Path, home: Path) -> dict:
    """A cold `prebake serve --write-back` of `model` into the empty `registry` (its bake); its first completion."""
    registry.mkdir(parents=True)
    server = ServeProcess(
        ["--model", model, "--registry", str(registry), "--write-back"],
        serve_env(home, recipes, PREBAKE_WRITE_BACK="index"),
    )
    try:
        server.wait_ready(timeout=1800)
        completion = server.complete(prompt=PROMPT, max_tokens=8, temperature=0)
    finally:
        server.stop()
    assert "prebake serve: compile: 2 step shapes compiled in place (aoti-package)" in server.log, server.log
    return completion


def _fetched_tree(model: str, recipes: Path, registry: Path, home: Path) -> Path:
    """`model`'s graphs tree from `registry`, fetched into the store at `home`."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "prebake"), "fetch", "--model", model, "--registry", str(registry)],
        env=serve_env(home, recipes),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (tree,) = {p.parents[1] for p in home.rglob("aoti/package.json")}
    return tree


@pytest.fixture(scope="module")
def baked(tmp_path_factory, recipes):
    """The registry the opt-in recipe's cold start with --write-back filled."""
    root = tmp_path_factory.mktemp("cold-aoti")
    _cold_bake(MODEL, recipes, root / "registry", root / "home")
    return root / "registry"


@pytest.fixture(scope="module")
def graphs_tree(tmp_path_factory, recipes, baked) -> Path:
    """The baked graphs tree, fetched into a store of its own: a copy each test may damage."""
    return _fetched_tree(MODEL, recipes, baked, tmp_path_factory.mktemp("fetched"))


class _ReportingServe(ServeProcess):
    def __init__(self, args: list[str], env: dict[str, str]):
        super().__init__(args, env, command=[sys.executable, "-c", _SERVE_REPORTING_MODULES])

    def modules(self, when: str) -> dict:
        rows = [json.loads(line.split("modules ", 1)[1]) for line in self.lines if line.startswith("modules ")]
        return next(r for r in rows if r["when"] == when)


def test_the_engine_serves_from_the_package_without_dynamo_or_inductors_python_and_answers_as_eager(
    tmp_path, recipes, baked
):
    env = {**serve_env(tmp_path / "home", recipes), "PYTHONPATH": str(REPO)}
    packaged = _ReportingServe(["--model", MODEL, "--registry", str(baked), "--on-miss", "fail"], env)
    eager = ServeProcess(["--model", MODEL, "--registry", str(baked), "--eager"], serve_env(tmp_path / "e", recipes))
    try:
        packaged.wait_ready()
        eager.wait_ready()
        got = [packaged.complete(prompt=PROMPT[:n], max_tokens=12, temperature=0) for n in (1, 5)]
        want = [eager.complete(prompt=PROMPT[:n], max_tokens=12, temperature=0) for n in (1, 5)]
    finally:
        eager.stop()
        packaged.stop()
    assert [g["choices"][0]["token_ids"] for g in got] == [w["choices"][0]["token_ids"] for w in want]
    for when in ("started", "exit"):  # once started, and after serving
        modules = packaged.modules(when)
        assert not modules["torch._dynamo"] and not modules["torch._inductor.lowering"], modules
        assert not modules["torch._inductor.codecache"] and not modules["torch._inductor.select_algorithm"], modules
    log = packaged.log
    assert "warm-up: 2 step shapes from the bundle (aoti-package)" in log and "prebake serve: compile:" not in log
    assert "warm-up by part: package-load" in log  # the package's load is its own part of the phase log
    assert "does not load here" not in log


def test_a_fine_tune_of_the_architecture_loads_the_same_package_and_answers_as_its_eager_self(
    tmp_path, tmp_path_factory, baked
):
    recipes = tmp_path_factory.mktemp("fine-tune")
    # other weights: the same keys
    write_recipe(recipes, MODEL, variant="aoti-package", seqs=1, seed=1, fallback="dynamo-precompile")
    servers = [
        ServeProcess(["--model", MODEL, "--registry", str(baked), *extra], serve_env(tmp_path / name, recipes))
        for name, extra in (("p", ["--on-miss", "fail"]), ("e", ["--eager"]))
    ]
    try:
        for server in servers:
            server.wait_ready()
        packaged, eager = (s.complete(prompt=PROMPT, max_tokens=8, temperature=0) for s in servers)
    finally:
        for server in servers:
            server.stop()
    assert "from the bundle (aoti-package)" in servers[0].log and "does not load here" not in servers[0].log
    assert packaged["choices"][0]["token_ids"] == eager["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """The default recipe's own bake (aoti-package, no fallback), bf16, of the same model and step
    shapes; its registry, home, recipes and first completion."""
    root = tmp_path_factory.mktemp("bare")
    recipes, registry, home = root / "recipes", root / "registry", root / "home"
    write_recipe(recipes, BARE, variant="aoti-package", seqs=1, dtype="bf16")  # [compile] fallback: none
    return registry, home, recipes, _cold_bake(BARE, recipes, registry, home)


@pytest.fixture(scope="module")
def bf16_tree(tmp_path_factory, bare) -> Path:
    """A bf16 package of the same step shapes: the bare bake's graphs tree, fetched into a store of its own."""
    registry, _, recipes, _ = bare
    return _fetched_tree(BARE, recipes, registry, tmp_path_factory.mktemp("bf16-home"))


# Logits of the compiled steps against eager ones, as max |difference| / max |eager logit|: fp32
# agrees to rounding (measured about 1e-6), bf16 to its 8-bit mantissa's rounding through 2 layers.
TOLERANCE = {"fp32": 1e-4, "bf16": 3e-2}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_step_shape_of_the_package_matches_eager_on_the_model_directly(
    dtype, request, tmp_path, recipes, graphs_tree
):
    tree = graphs_tree if dtype == "fp32" else request.getfixturevalue("bf16_tree")
    done = _python(_COMPARE, str(tree), dtype, MODEL, env=serve_env(tmp_path / "home", recipes))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["type"] == "PackageSteps" and got["loaded"] == {
        "torch._dynamo": False,
        "torch._inductor.lowering": False,
    }
    assert {r["shape"] for r in got["report"]} == {"prefill-b1-t32-c32", "decode-b1-t1-c32"}
    for row in got["report"]:
        assert row["max_abs"] <= TOLERANCE[dtype] * row["scale"], row
        assert row["tokens"][0] == row["tokens"][1], row  # the greedy token of every row
        assert row["cache_max_abs"] <= TOLERANCE[dtype] * 10, row  # the package wrote the KV cache as eager did


def _damage(tree: Path, how: str, tmp_path: Path) -> Path:
    """A copy of `tree` whose package does not load here, in the way `how` names."""
    copy = tmp_path / how
    shutil.copytree(tree, copy)
    recorded = copy / "aoti" / "package.json"
    package = copy / "aoti" / "steps.pt2"
    document = json.loads(recorded.read_text())
    if how in ("isa", "isa-and-aot"):
        from prebake.engine.bundled.runtime.aoti import ISA_FLAGS
        from prebake.engine.common.cpu import cpu_flags

        flags = cpu_flags()
        document["cpu_isa"] = next(isa for isa, needs in ISA_FLAGS.items() if not needs <= flags)
    elif how == "torch":
        document["torch"] = "2.1.0"
    if how in ("isa", "torch", "isa-and-aot"):
        recorded.write_text(json.dumps(document))
        for function in (copy / "aot").glob("*.pt2fn") if how == "isa-and-aot" else ():
            function.write_bytes(function.read_bytes()[:100])  # dynamo-precompile's functions cut short too
        return copy
    entries = {}
    with zipfile.ZipFile(package) as archive:
        for info in archive.infolist():
            entries[info.filename] = archive.read(info)
    decode = [n for n in entries if "/decode-" in n]
    if how == "damaged-so":
        (so,) = [n for n in decode if n.endswith(".so")]
        entries[so] = entries[so][:4096]  # an ELF header and little else: dlopen refuses it
    elif how == "missing-model":  # a package whose own bytes are whole, without the decode model
        entries = {n: data for n, data in entries.items() if n not in decode}
    with zipfile.ZipFile(package, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    if how == "missing-model":
        document["sha256"] = hashlib.sha256(package.read_bytes()).hexdigest()
        recorded.write_text(json.dumps(document))
    return copy


# Runs the engine's warm-up (prebake.engine.bundled.warm_up: the variants' chain) on a graphs tree,
# writable where it lies, with the store whose stats count the fallback; prints the log and what served.
_WARM_UP = """
import json, sys
from pathlib import Path
from prebake.artifacts.recipe.schema import load_recipe
from prebake.artifacts.store.local import Store
from prebake.engine.bundled import start
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic
from prebake.engine.bundled.warm_up import GraphsTree, WarmUp

tree, store = Path(sys.argv[1]), Store(Path(sys.argv[2]))
recipe = load_recipe(sys.argv[3])
shapes = [StepShape(**s["shape"]) for s in json.loads((tree / "graphs.json").read_text())["shapes"]]
model, cache = model_and_cache(recipe, "fp32")
lines = []
log = start.StartupPhaseLog(Metrics(), lines.append)
warm = WarmUp(log, GraphsTree(None, tree, path=tree, private=True), store)
steps, detail = warm.steps("aoti-package", recipe, model, cache, {s: Tactic() for s in shapes})
out = steps.run_dummy(shapes[-1], Tactic())
print(json.dumps({"type": type(steps).__name__, "detail": detail, "log": lines, "sum": float(out.double().sum())}))
"""


def _warm_up(tree: Path, home: Path, recipes: Path) -> tuple[dict, str]:
    """The engine's warm-up on `tree` in a fresh process, with the store at `home`: what served, and its log.
    Its temporary folder is counted after it exits (issue 49 item 8): torch's package loader leaves its
    aotinductor_<random suffix> folder there when it refuses a model, so a package that does not load makes none.
    The folder is made as a start's is (torch's machine folder linked in: its precompiled headers and
    ISA probes are the machine's, not compiled again per test)."""
    from prebake.engine.bundled.cache_layout import temp_dir

    systemp = temp_dir(home.parent / "system")
    env = {**serve_env(home, recipes), "TORCHINDUCTOR_CACHE_DIR": str(tree / "inductor"), "TMPDIR": str(systemp)}
    done = _python(_WARM_UP, str(tree), str(home), MODEL, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not list(systemp.glob("aotinductor_*")), "a loader's extraction folder outlived the process"
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got, "\n".join(got["log"])


@pytest.mark.parametrize("how", ["isa", "torch", "damaged-so", "missing-model"])
def test_a_package_that_does_not_load_here_falls_back_to_dynamo_precompile_says_why_and_is_counted(
    how, tmp_path, recipes, graphs_tree
):
    home = tmp_path / "home"
    got, log = _warm_up(_damage(graphs_tree, how, tmp_path), home, recipes)
    assert got["type"] == "AotSteps", log  # dynamo-precompile's functions served, nothing compiled
    reason = {
        "isa": "its kernels were built for vector ISA",
        "torch": "it was compiled with torch 2.1.0",
        "damaged-so": "aoti/steps.pt2 is damaged (sha256",
        "missing-model": "the AOTInductor package does not load here: its archive holds no model for decode-",
    }[how]
    assert reason in log and "taking dynamo-precompile from the same graphs tree" in log, log
    if how == "isa":
        assert "this CPU lacks" in log
    assert _graphs_stats(home, recipes)["variant_fallbacks"] == 1


def test_a_tree_whose_package_and_functions_do_not_load_warms_up_from_its_inductor_cache_each_step_counted(
    tmp_path, recipes, graphs_tree
):
    home = tmp_path / "home"
    got, log = _warm_up(_damage(graphs_tree, "isa-and-aot", tmp_path), home, recipes)
    assert got["type"] == "CompiledSteps", log  # torch.compile over the tree's Inductor cache
    assert "this CPU lacks" in log and "taking dynamo-precompile from the same graphs tree" in log, log
    assert "dynamo-precompile: precompiled functions do not load here" in log, log
    assert "AOTAutograd cache" in got["detail"] and "0 miss(es)" in got["detail"], got["detail"]
    assert _graphs_stats(home, recipes)["variant_fallbacks"] == 2  # aoti-package, then dynamo-precompile


def _graphs_stats(home: Path, recipes: Path) -> dict:
    """`prebake store stats --json`'s counts for the graphs kind."""
    stats = subprocess.run(
        [str(Path(sys.executable).parent / "prebake"), "store", "stats", "--json"],
        env=serve_env(home, recipes),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stats.returncode == 0, stats.stderr
    return json.loads(stats.stdout)["kinds"]["graphs"]


def test_a_package_asked_for_a_shape_it_lacks_names_it_and_the_bucket_set(tmp_path, recipes, graphs_tree):
    code = (
        "import json, sys\nfrom pathlib import Path\n"
        "from prebake.artifacts.recipe.schema import load_recipe\n"
        "from prebake.engine.bundled.build import model_and_cache\n"
        "from prebake.engine.bundled.runtime import aoti\n"
        "from prebake.engine.bundled.runtime.shapes import StepShape\n"
        "model, cache = model_and_cache(load_recipe(sys.argv[2]), 'fp32')\n"
        "try:\n"
        "    aoti.load_package(model, cache, [StepShape('decode', 1, 1, 16)], Path(sys.argv[1]))\n"
        "except aoti.PackageDoesNotLoad as exc:\n"
        "    print(json.dumps({'reason': str(exc)}))\n"
    )
    done = _python(code, str(graphs_tree), MODEL, env=serve_env(tmp_path / "home", recipes))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "holds no model for decode-b1-t1-c16 (baked for another bucket set)" in json.loads(done.stdout)["reason"]


def test_the_package_holds_no_weights(graphs_tree):
    recorded = json.loads((graphs_tree / "aoti" / "package.json").read_text())
    assert "model.embed_tokens.weight" in recorded["constants"]
    with zipfile.ZipFile(graphs_tree / "aoti" / "steps.pt2") as archive:
        names = archive.namelist()
    assert not [n for n in names if "/weights/" in n or n.endswith((".pt", ".bin", "constants.bin"))], names
    assert [n for n in names if n.endswith(".so")] and not [n for n in names if n.endswith(".cpp")], names
    assert os.path.getsize(graphs_tree / "aoti" / "steps.pt2") > 0


def test_decode_multiplies_and_attends_in_inductor_reductions_and_prefill_keeps_torchs_kernels(graphs_tree, tmp_path):
    """runtime.gemv: the decode model's one-row products and one-query attention are generated kernels
    (no extern mm or SDPA left to call), prefill's are torch's mm and SDPA as before; the equality with
    eager is checked above."""
    imports = {}
    with zipfile.ZipFile(graphs_tree / "aoti" / "steps.pt2") as archive:
        for member in (m for m in archive.namelist() if m.endswith(".so")):
            model = next(part for part in Path(member).parts if part.startswith(("decode-", "prefill-")))
            listed = subprocess.run(
                ["nm", "-D", "--undefined-only", archive.extract(member, tmp_path)], capture_output=True, text=True
            )
            imports[model] = {line.split()[-1].split("@")[0] for line in listed.stdout.splitlines() if line.strip()}
    assert "aoti_torch_cpu_mm_out" not in imports["decode-b1-t1-c32"], sorted(imports["decode-b1-t1-c32"])
    assert "aoti_torch_cpu_mm_out" in imports["prefill-b1-t32-c32"], sorted(imports["prefill-b1-t32-c32"])
    sdpa = "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu"
    assert sdpa not in imports["decode-b1-t1-c32"], sorted(imports["decode-b1-t1-c32"])
    assert sdpa in imports["prefill-b1-t32-c32"], sorted(imports["prefill-b1-t32-c32"])


def test_a_package_that_does_not_load_in_a_tree_without_fallback_compiles_in_place_says_why_and_serves(bare):
    registry, home, recipes, want = bare
    (tree,) = {p.parents[1] for p in (home / "trees").rglob("aoti/package.json")}  # the store's graphs tree
    tampered(tree)  # a hand with write rights: the store installs trees read-only
    assert json.loads((tree / "graphs.json").read_text())["fallback"] == "none"
    assert sorted(p.name for p in tree.iterdir()) == ["aoti", "graphs.json"]  # the package alone: no aot/, inductor/
    package = tree / "aoti" / "steps.pt2"
    data = bytearray(package.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 64])
    package.write_bytes(bytes(data))  # damaged in place, its size kept: the store's cheap check still passes
    served = ServeProcess(["--model", BARE, "--registry", str(registry), "--on-miss", "fail"], serve_env(home, recipes))
    try:
        served.wait_ready(timeout=1800)
        got = served.complete(prompt=PROMPT, max_tokens=8, temperature=0)
    finally:
        served.stop()
    log = served.log
    assert "graphs in the store" in log, log  # a hit, whose package does not load here
    assert "aoti/steps.pt2 is damaged (sha256" in log, log
    assert 'the graphs tree carries no fallback ([compile] fallback = "none"): compiling in place' in log, log
    assert "compile: 2 step shapes compiled in place (aoti-package)" in log, log
    assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
    graphs = _graphs_stats(home, recipes)
    # the cold start's miss and compile, then the package's fallback and its compile: no second miss
    assert (graphs["variant_fallbacks"], graphs["fallback_compiles"], graphs["misses"]) == (1, 2, 1), graphs
