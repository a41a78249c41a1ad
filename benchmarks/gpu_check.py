"""The GPU check: one command for an NVIDIA host (H100/H200 class) with torch and CUDA preinstalled
and no network at all; it ends with the same JSON line as benchmarks/startup.py.

    python benchmarks/gpu_check.py [--wheelhouse wheelhouse] [--work DIR] [--precision bf16] [--cpu] [--recipe FILE]
                                   [--fp8]
    python benchmarks/gpu_check.py --build-wheelhouse wheelhouse [--python-version 3.12 ...]   (here)

On the GPU host (`make gpu-check`): install (a venv over the host's torch, prebake and its other
dependencies from the wheels beside this checkout: nothing downloaded); probe (torch, CUDA, the GPU;
tiny-llama with its [matrix] platform set to this GPU's, "cuda:sm_90" on an H100 or H200); start
(benchmarks/startup.py for both variants, the default "aoti-package", cubins loaded by torch's C++
loader, and "dynamo-precompile" beside it: each one's bake, a cold and a prebaked start, the eager
floor; its JSON line, the bakes' compile ratio among it, and one more with the host's facts).
--fp8 (sm_89+) adds tiny-llama and the 1B baked and started at fp8 and bf16 (aoti-package), and eager
fp8 / bf16 decode tokens/s: the speed this CPU (FP8 emulated) cannot show. Without a GPU (or with --cpu) the same steps run on the CPU: the fallback the tests run here (on a
two-layer recipe given with --recipe: the subject there is the check's steps, not tiny-llama's shapes).

The wheelhouse is built on a machine with PyPI (`make gpu-wheelhouse`): prebake's wheel and binary
wheels of what the check runs besides torch, for the GPU host's Python, manylinux x86_64; it must
stay under 64 MiB (WHEELHOUSE_LIMIT), and the build exits 1, saying its size, when it does not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
    venv.EnvBuilder(system_site_packages=True, with_pip=True, clear=True).create(folder)
    python = folder / "bin" / "python"
    install = ["prebake[serve]", *(r for r in runtime_requirements() if r.startswith("safetensors"))]
    _run([str(python), "-m", "pip", "install", "--quiet", "--no-index", "--find-links", str(wheelhouse), *install])
    return python


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
    output = _run(argv, env=env, capture=True, echo=True)
    return json.loads(output.strip().splitlines()[-1])


FP8_RECIPES = (RECIPE, REPO / "recipes" / "llama3.2-1b.toml")  # what the FP8 modes bake and serve
_DECODE = """
import json, sys, time, torch
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic
recipe, platform, steps_n = load_recipe(sys.argv[1]), sys.argv[2], 32
speed = {}
for dtype in ("bf16", "fp8"):
    steps = CompiledSteps(*model_and_cache(recipe, dtype, platform), compile=False)
    ids, slot = torch.tensor([[1] * 8]), torch.tensor([0])
    token = steps.prefill(ids, torch.tensor([8]), slot, Tactic()).argmax(-1)
    started = time.perf_counter()
    for position in range(8, 8 + steps_n):
        token = steps.decode(token, torch.tensor([position]), slot, recipe.serving.max_model_len, Tactic()).argmax(-1)
    speed[dtype] = steps_n / (time.perf_counter() - started)
print(json.dumps({"decode_tokens_per_s": speed, "fp8_over_bf16": speed["fp8"] / speed["bf16"]}))
"""


def fp8_ready(facts: dict) -> str | None:
    """Why this host cannot run the FP8 modes, or None: FP8 needs sm_89+ (the CPU emulates it: the fallback)."""
    platform = facts["platform"]
    if platform.startswith("cuda:sm_") and int(platform.removeprefix("cuda:sm_")) < 89:
        return f"FP8 needs a GPU of sm_89 or newer (Ada, Hopper, Blackwell); this one is {platform}"
    return None


def fp8_modes(python: Path, facts: dict, work: Path, recipes: tuple[Path, ...] = FP8_RECIPES) -> dict:
    """Bake and start each recipe at fp8 and at bf16 (aoti-package: prebaked / eager, overhead removed),
    then eager decode tokens/s of fp8 and bf16 on this device: what the CPU here cannot show."""
    figures = {}
    for recipe in recipes:
        name = str(tomllib.loads(recipe.read_text())["model"]["name"])
        row = {}
        for precision in ("bf16", "fp8"):
            where = work / f"{name}-{precision}"
            row[precision] = check(
                python, facts, where, precision, variants=("aoti-package",), recipe=recipe, dtypes=(precision,)
            )
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREBAKE_")} | {"PYTHONPATH": ""}
        env["PREBAKE_HOME"] = str(work / f"{name}-decode-home")
        output = _run([str(python), "-c", _DECODE, str(recipe), facts["platform"]], env=env, capture=True)
        row["decode"] = json.loads(output.strip().splitlines()[-1])
        figures[name] = row
    return figures


def _run(argv: list[str], env: dict | None = None, capture: bool = False, echo: bool = False) -> str:
    if not capture:
        subprocess.run(argv, env=env, check=True)
        return ""
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if echo:
        print(done.stdout, end="", flush=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv[:3])} ... failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, default=REPO / "wheelhouse", help="the wheels carried along")
    parser.add_argument("--work", type=Path, help="working folder (default: a new temporary one)")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is present")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the recipe file to check (default: tiny-llama)")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 modes: tiny-llama and the 1B at fp8 and bf16")
    parser.add_argument("--build-wheelhouse", type=Path, metavar="DIR", help="build the wheelhouse here and exit")
    parser.add_argument("--python-version", action="append", help="with --build-wheelhouse (repeatable)")
    args = parser.parse_args(argv)
    if args.build_wheelhouse:
        report = build_wheelhouse(args.build_wheelhouse, args.python_version or list(DEFAULT_PYTHONS))
        print(json.dumps({"benchmark": "gpu_wheelhouse", **report}))
        return 0 if report["within_limit"] else 1
    if not args.recipe.is_file():
        raise SystemExit(f"--recipe {args.recipe}: no such file; name a recipe .toml (default {RECIPE})")
    started = time.monotonic()
    work = (args.work or Path(tempfile.mkdtemp(prefix="prebake-gpu-check-"))).resolve()
    python = offline_venv(work / "venv", args.wheelhouse.resolve())
    facts = host_facts(python)
    if args.cpu:
        facts["platform"] = "cpu"
    print(f"host: {json.dumps(facts)}", flush=True)
    figures = check(python, facts, work, args.precision, recipe=args.recipe.resolve())
    if args.fp8:
        why = fp8_ready(facts)
        print(f"fp8 modes: {why}" if why else "fp8 modes: tiny-llama and llama3.2-1b at fp8 and bf16", flush=True)
        figures["fp8"] = {"skipped": why} if why else fp8_modes(python, facts, work / "fp8")
    print(json.dumps({"benchmark": "gpu_check", **facts, "seconds": round(time.monotonic() - started, 1)}))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
