"""The GPU check: one command for an NVIDIA host (H100/H200 class) with torch and CUDA preinstalled
and no network at all; it ends with the same JSON line as benchmarks/startup.py.

    python benchmarks/gpu_check.py [--wheelhouse wheelhouse] [--work DIR] [--precision bf16] [--cpu] [--recipe FILE]
                                   [--fp8] [--variant V[,V]] [--cold-from-bake]
                                   [--budget S] [--step-budget S] [--results FILE]
    python benchmarks/gpu_check.py --build-wheelhouse wheelhouse [--python-version 3.12 ...]   (here)

On the GPU host (`make gpu-check`): install (a venv over the host's torch, prebake's other dependencies
from the wheels beside this checkout); probe (torch, CUDA, the GPU; tiny-llama's [matrix] platform set to
this GPU's, "cuda:sm_90" on an H100 or H200); start (benchmarks/startup.py for "aoti-package" and
"dynamo-precompile": each one's bake, a cold and a prebaked start, the eager floor). --fp8 (sm_89+) adds
eager fp8 / bf16 decode tokens/s and tiny-llama and the 1B started at fp8 and bf16. Each is one step,
bounded by --budget and --step-budget on a lent GPU (skipped when it would not fit; a failure or
overrun recorded and the next step run), its figures appended to --results as it ends. Without a GPU
(or with --cpu) the same steps run on the CPU: the fallback the tests run (on a two-layer --recipe).

The wheelhouse is built on a machine with PyPI (`make gpu-wheelhouse`): prebake's wheel and binary
wheels of what the check runs besides torch, for the GPU host's Python, manylinux x86_64; it must
stay under 64 MiB (WHEELHOUSE_LIMIT), and the build exits 1, saying its size, when it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELHOUSE_LIMIT = 64 * 2**20
DEFAULT_PYTHONS = (
    "3.12",
)  # the Python of NVIDIA's and PyTorch's CUDA images; add the host's own with --python-version
RECIPE = REPO / "recipes" / "tiny-llama.toml"  # what the check bakes and starts unless --recipe names another


def runtime_requirements(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """What the check runs besides torch (the host's own), as pyproject.toml declares it: the bare
    wheel's dependencies, the serve extra, and the torch extra less torch (safetensors)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    beside_torch = [r for r in extras["torch"] if not r.startswith("torch")]
    return [*project["dependencies"], *extras["serve"], *beside_torch]


def build_wheelhouse(out: Path, pythons: list[str], pip: list[str] | None = None) -> dict:
    """prebake's wheel and its dependencies' wheels for each Python into `out`; what it holds."""
    pip = pip or [sys.executable, "-m", "pip"]
    out.mkdir(parents=True, exist_ok=True)
    _run([*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)])
    for version in pythons:
        _run(
            [
                *pip,
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--dest",
                str(out),
                "--python-version",
                version,
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "manylinux_2_28_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                *runtime_requirements(),
            ]
        )
    return wheelhouse_report(out)


def wheelhouse_report(folder: Path) -> dict:
    wheels = sorted(folder.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    return {
        "wheels": len(wheels),
        "bytes": size,
        "limit_bytes": WHEELHOUSE_LIMIT,
        "within_limit": size < WHEELHOUSE_LIMIT,
    }


def offline_venv(folder: Path, wheelhouse: Path) -> Path:
    """A venv that sees this interpreter's site-packages (the host's torch) with prebake installed
    from `wheelhouse` alone; its python."""
    if not any(wheelhouse.glob("prebake-*.whl")):
        raise SystemExit(
            f"{wheelhouse} holds no prebake wheel; build the wheelhouse where PyPI is reachable "
            f"(make gpu-wheelhouse) and carry it beside this checkout"
        )
    python = folder / "bin" / "python"
    try:
        venv.EnvBuilder(system_site_packages=True, with_pip=True, clear=True).create(folder)
        pip = [str(python), "-m", "pip"]
    except subprocess.CalledProcessError:  # a base Python without ensurepip: this interpreter's pip fills it
        venv.EnvBuilder(system_site_packages=True, with_pip=False, clear=True).create(folder)
        pip = [sys.executable, "-m", "pip", "--python", str(python)]
    install = ["prebake[serve]", *(r for r in runtime_requirements() if r.startswith("safetensors"))]
    _run([*pip, "install", "--quiet", "--no-index", "--find-links", str(wheelhouse), *install])
    link_host_site(folder)
    return python


def link_host_site(folder: Path, host: list[str] | None = None) -> Path:
    """A .pth line in the venv at `folder` for each site-packages folder of this interpreter (`host`),
    after the venv's own: the host's torch is seen however it was installed. A venv's
    `system_site_packages` reaches only the base interpreter's folder, and the CUDA images' torch lives
    in a venv of its own (/opt/torch/.venv on the lent H100s), where it would not be seen at all. It is
    written after the install, so prebake's dependencies still come from the wheelhouse alone."""
    import site

    paths = host if host is not None else [p for p in site.getsitepackages() if Path(p).is_dir()]
    site_of_venv = next((folder / "lib").glob("python*/site-packages"))
    pth = site_of_venv / "zz-host-site.pth"
    pth.write_text("".join(f"{p}\n" for p in paths))
    return pth


def host_facts(python: Path) -> dict:
    """torch, CUDA and the GPU as the venv's interpreter sees them."""
    code = (
        "import json, torch\n"
        "cuda = torch.cuda.is_available()\n"
        "cap = torch.cuda.get_device_capability(0) if cuda else None\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'gpu': cuda,"
        " 'device_name': torch.cuda.get_device_name(0) if cuda else '',"
        " 'platform': f'cuda:sm_{cap[0]}{cap[1]}' if cap else 'cpu',"
        " 'precompile': hasattr(torch.compile(lambda x: x), 'aot_compile')}))"
    )
    return json.loads(_run([str(python), "-c", code], capture=True).strip().splitlines()[-1])


def recipe_for(platform: str, folder: Path, source: Path = RECIPE, dtypes: tuple[str, ...] = ()) -> str:
    """The recipe `source` with its [matrix] platform set to this host's (and its dtypes to `dtypes` when
    given), written into `folder` (the folder PREBAKE_RECIPES names); its model's name."""
    text = source.read_text()
    if dtypes:
        text = re.sub(r"^dtype = .*$", f"dtype = {json.dumps(list(dtypes))}", text, count=1, flags=re.M)
    lines = [f'platform = ["{platform}"]' if line.startswith("platform = ") else line for line in text.splitlines()]
    if lines == text.splitlines() and platform != "cpu":
        raise SystemExit(f"{source} has no [matrix] platform line to set to {platform}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / source.name).write_text("\n".join(lines) + "\n")
    return str(tomllib.loads(text)["model"]["name"])


GPU_VARIANTS = ("dynamo-precompile", "aoti-package")  # the default (aoti-package) and the variant it replaced


def check(
    python: Path,
    facts: dict,
    work: Path,
    precision: str,
    *,
    cold_from_bake: bool = False,
    variants: tuple[str, ...] = GPU_VARIANTS,
    recipe: Path = RECIPE,
    dtypes: tuple[str, ...] = (),
    timeout: float | None = None,
) -> dict:
    """benchmarks/startup.py on this host's recipe with the venv's prebake, for `variants`; its JSON line. With
    `cold_from_bake` the bake (a cold start with --write-back) is the cold figure, as in `make demo`:
    one compile instead of two (the tests' CPU fallback; the GPU check starts cold again)."""
    recipes = work / "recipes"
    model = recipe_for(facts["platform"], recipes, recipe, dtypes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")} | {"PREBAKE_RECIPES": str(recipes)}
    env["PYTHONPATH"] = ""  # the installed prebake, not this checkout's modules
    argv = [str(python), str(REPO / "benchmarks" / "startup.py"), "--model", model, "--precision", precision]
    argv += ["--variant", ",".join(variants), "--iterations", "1", "--work", str(work / "startup")]
    argv += ["--cold-from-bake"] if cold_from_bake else []
    output = _run(argv, env=env, capture=True, echo=True, timeout=timeout)
    return json.loads(output.strip().splitlines()[-1])


FP8_RECIPES = (RECIPE, REPO / "recipes" / "llama3.2-1b.toml")  # what the FP8 modes bake and serve
_DECODE = """
import json, sys, time, torch
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
recipe, platform, warm, timed = load_recipe(sys.argv[1]), sys.argv[2], 4, 32
speed = {}
for dtype in ("bf16", "fp8"):
    steps = CompiledSteps(*model_and_cache(recipe, dtype, platform), compile=False)
    ids, slot = torch.tensor([[1] * 8]), torch.tensor([0])
    token = steps.prefill(ids, torch.tensor([8]), slot, Tactic()).argmax(-1)
    for position in range(8, 8 + warm + timed):  # each step's logits come back to the CPU: synchronized
        if position == 8 + warm:
            started = time.perf_counter()
        token = steps.decode(token, torch.tensor([position]), slot, recipe.serving.max_model_len, Tactic()).argmax(-1)
    speed[dtype] = timed / (time.perf_counter() - started)
    del steps
print(json.dumps({"decode_tokens_per_s": speed, "fp8_over_bf16": speed["fp8"] / speed["bf16"]}))
"""


def fp8_ready(facts: dict) -> str | None:
    """Why this host cannot run the FP8 modes, or None: FP8 needs sm_89+ (the CPU emulates it: the fallback)."""
    platform = facts["platform"]
    if platform.startswith("cuda:sm_") and int(platform.removeprefix("cuda:sm_")) < 89:
        return f"FP8 needs a GPU of sm_89 or newer (Ada, Hopper, Blackwell); this one is {platform}"
    return None


def fp8_decode(python: Path, facts: dict, work: Path, recipe: Path, timeout: float | None = None) -> dict:
    """Eager decode tokens/s of `recipe`'s model at bf16 and at fp8 (quantized on load) on this device."""
    name = str(tomllib.loads(recipe.read_text())["model"]["name"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")} | {"PYTHONPATH": ""}
    env["PREBAKE_HOME"] = str(work / f"{name}-decode-home")
    output = _run([str(python), "-c", _DECODE, str(recipe), facts["platform"]], env=env, capture=True, timeout=timeout)
    return json.loads(output.strip().splitlines()[-1])


class Stages:
    """The check's steps one after another within a budget of seconds: a step that fails is recorded
    with the end of its output and the next one still runs (a lent GPU's minutes are few: one step's
    failure must not cost the others' figures); a step is skipped, saying so, when less time is left
    than it needs; each step's figures are appended to `results` (one JSON line) as soon as it ends."""

    def __init__(self, budget_s: float | None, results: Path | None, step_s: float | None = None):
        self.deadline = time.monotonic() + budget_s if budget_s else float("inf")
        self.step_s = step_s or float("inf")  # the most one step may take: a stuck one leaves the rest their turn
        self.results = results
        self.figures: dict[str, dict] = {}
        self.failed: list[str] = []

    def run(self, name: str, needs_s: float, step) -> dict:
        """`step(timeout)` if about `needs_s` seconds are left: it gets the budget left, or `step_s` if less."""
        started = time.monotonic()
        budget_left = self.deadline - started
        left = min(budget_left, self.step_s)
        row: dict
        if budget_left < needs_s:
            row = {"skipped": f"{budget_left:.0f} s of the budget left, this step needs about {needs_s:.0f} s"}
        else:
            print(f"== {name}" + (f" (up to {left:.0f} s)" if left != float("inf") else ""), flush=True)
            try:
                row = step(None if left == float("inf") else left)
            except (SystemExit, Exception) as failure:  # _run's names the command and its output's end
                row = {"failed": f"{type(failure).__name__}: {failure}"[-4000:]}
                self.failed.append(name)
        row = {**row, "stage_s": round(time.monotonic() - started, 1)}
        self.figures[name] = row
        print(f"{name}: {json.dumps(row)[:2000]}", flush=True)
        if self.results:
            with self.results.open("a") as out:
                out.write(json.dumps({"stage": name, **row}) + "\n")
        return row


def fp8_stages(stages: Stages, python: Path, facts: dict, work: Path, recipes: tuple[Path, ...] = FP8_RECIPES) -> None:
    """Each recipe's eager fp8 / bf16 decode speed on this device first (cheap: the speed the CPU here
    cannot show), then each one baked and started at fp8 and at bf16 (aoti-package: prebaked / eager,
    overhead removed); a start the check already ran (tiny-llama at bf16) is not run again."""
    names = {recipe: str(tomllib.loads(recipe.read_text())["model"]["name"]) for recipe in recipes}
    for i, (recipe, name) in enumerate(names.items()):
        stages.run(f"decode {name}", 60 + 60 * i, lambda left, r=recipe: fp8_decode(python, facts, work, r, left))
    for i, (recipe, name) in enumerate(names.items()):
        for precision in ("fp8", "bf16"):
            label = f"start {name} {precision}"
            if label in stages.figures:
                continue
            where = work / f"{name}-{precision}"
            stages.run(
                label,
                90 + 150 * i,
                lambda left, r=recipe, w=where, p=precision: check(
                    python,
                    facts,
                    w,
                    p,
                    variants=("aoti-package",),
                    recipe=r,
                    dtypes=(p,),
                    cold_from_bake=True,
                    timeout=left,
                ),
            )


def _run(
    argv: list[str], env: dict | None = None, capture: bool = False, echo: bool = False, timeout: float | None = None
) -> str:
    """Run `argv` (its own process group, ended whole after `timeout` seconds); its output if `capture`.
    A failure or a timeout raises SystemExit naming the command with the end of its output."""
    process = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
        text=True,
        start_new_session=True,  # the servers and compile workers a step starts end with it
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise SystemExit(
            f"{_named(argv)} ... ran past its {timeout:.0f} s and was stopped:\n{(stdout or '')[-3000:]}\n{(stderr or '')[-3000:]}"
        ) from None
    if echo and stdout:
        print(stdout, end="", flush=True)
    if process.returncode != 0:
        raise SystemExit(
            f"{_named(argv)} ... failed ({process.returncode}):\n{(stdout or '')[-3000:]}\n{(stderr or '')[-3000:]}"
        )
    return stdout or ""


def _named(argv: list[str]) -> str:
    """The command's first words, a script given with -c cut to its first line."""
    return " ".join(word.strip().splitlines()[0][:80] if word.strip() else word for word in argv[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, default=REPO / "wheelhouse", help="the wheels carried along")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is present")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe file to check (default: tiny-llama)")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 modes: tiny-llama and the 1B at fp8 and bf16")
    parser.add_argument(
        "--variant",
        default=",".join(GPU_VARIANTS),
        help=f"the graphs variants the check starts, joined by commas (default {','.join(GPU_VARIANTS)})",
    )
    parser.add_argument(
        "--cold-from-bake",
        action="store_true",
        help="count each bake (a cold start with --write-back) as the cold start: one compile a variant, not two",
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole check: a step that would not fit is skipped and says so (a lent GPU's minutes)",
    )
    parser.add_argument("--step-budget", type=float, help="seconds one step may take at most (with --budget)")
    parser.add_argument("--results", type=Path, help="append each step's figures here (one JSON line) as it ends")
    parser.add_argument("--build-wheelhouse", type=Path, metavar="DIR", help="build the wheelhouse here and exit")
    parser.add_argument("--python-version", action="append", help="with --build-wheelhouse (repeatable)")
    args = parser.parse_args(argv)
    if args.build_wheelhouse:
        report = build_wheelhouse(args.build_wheelhouse, args.python_version or list(DEFAULT_PYTHONS))
        print(json.dumps({"benchmark": "gpu_wheelhouse", **report}))
        return 0 if report["within_limit"] else 1
    if not args.recipe.is_file():
        raise SystemExit(f"--recipe {args.recipe}: no such file; name a recipe .toml (default {RECIPE})")
    variants = tuple(v for v in args.variant.split(",") if v)
    if not variants or set(variants) - set(GPU_VARIANTS):
        raise SystemExit(f"--variant {args.variant}: name one or more of {', '.join(GPU_VARIANTS)}, joined by commas")
    started = time.monotonic()
    stages = Stages(args.budget, args.results, args.step_budget)
    work = (args.work or Path(tempfile.mkdtemp(prefix="prebake-gpu-check-"))).resolve()
    python = offline_venv(work / "venv", args.wheelhouse.resolve())
    facts = host_facts(python)
    if args.cpu:
        facts["platform"] = "cpu"
    print(f"host: {json.dumps(facts)}", flush=True)
    recipe = args.recipe.resolve()
    name = str(tomllib.loads(recipe.read_text())["model"]["name"])
    stages.run(
        f"start {name} {args.precision}"
        if variants == ("aoti-package",)
        else f"start {name} {args.precision} variants",
        60,
        lambda left: check(
            python,
            facts,
            work,
            args.precision,
            recipe=recipe,
            variants=variants,
            cold_from_bake=args.cold_from_bake,
            timeout=left,
        ),
    )
    if args.fp8:
        why = fp8_ready(facts)
        print(f"fp8 modes: {why}" if why else "fp8 modes: tiny-llama and llama3.2-1b at fp8 and bf16", flush=True)
        if why:
            stages.figures["fp8"] = {"skipped": why}
        else:
            fp8_stages(stages, python, facts, work / "fp8")
    seconds = round(time.monotonic() - started, 1)
    print(
        json.dumps(
            {"benchmark": "gpu_check", **facts, "seconds": seconds, "failed": stages.failed, "steps": stages.figures}
        )
    )
    return 1 if stages.failed else 0


if __name__ == "__main__":
    sys.exit(main())
