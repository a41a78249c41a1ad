"""prebake from an installed wheel, outside any checkout: the shipped recipes, plan and bake; and
the bare wheel (no extras), which fetches through a folder and names the extra anything else needs.

The wheel is built from this tree and installed (without dependencies) into fresh venvs in a
temporary folder, so every prebake module imported comes from the wheel, never from the checkout.
The full venv sees the test's own environment (every extra) through a path entry placed after its
site-packages; the bare venv holds only what the wheel's metadata declares without extras, plus
torch (installed first, as the README says), linked from the test's environment
(tests/support/site_subset.py) and checked by `pip check`.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.baking import REPO, wheel_build_lock
from tests.support.seeding import plan_here, seed
from tests.support.serving import write_recipe
from tests.support.site_subset import closure, link_into

# the modules of every extra but torch's own: none may be importable in the bare venv
EXTRAS_MODULES = ("fastapi", "uvicorn", "prometheus_client", "tokenizers", "safetensors", "boto3", "tqdm")
EXTRAS_MODULES += ("huggingface_hub", "httpx", "ray")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The prebake wheel, built from this tree."""
    root = tmp_path_factory.mktemp("dist")
    with wheel_build_lock():
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root, REPO])
    [built] = root.glob("prebake-*.whl")
    return built


def test_the_wheel_installs_one_import_package_prebake_and_its_console_script(wheel):
    """No top-level `artifacts`, `engine` or `registry`: names unrelated projects also take."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"prebake"}, tops
    assert "prebake/artifacts/fetch/pipeline.py" in names and "prebake/recipes/tiny-llama.toml" in names
    assert "prebake = prebake.engine.cli:entry" in scripts


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel) -> Path:
    """A fresh venv with the prebake wheel; returns its bin folder."""
    root = tmp_path_factory.mktemp("wheel")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    purelib = Path(sysconfig.get_paths(vars={"base": venv, "platbase": venv})["purelib"])
    (purelib / "zz_prebake_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps", wheel])
    return venv / "bin"


def _run(argv, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREBAKE_", "PYTHON", "VIRTUAL_ENV"))}
    return {**env, "PREBAKE_HOME": str(tmp_path / "home"), "PREBAKE_TRUSTED_KEYS": ""}


def test_the_wheel_imports_its_own_modules_and_ships_the_recipes(installed, tmp_path):
    where = _run(
        [
            installed / "python",
            "-c",
            "import prebake.artifacts, prebake.engine.cli, prebake.artifacts.recipe.catalog as r; "
            "print(prebake.artifacts.__file__); print(r.list_recipes())",
        ],
        cwd=tmp_path,
        env=_env(tmp_path),
    ).stdout.splitlines()
    assert where[0].startswith(str(installed.parent)) and "tiny-llama" in where[1] and "llama3-8b" in where[1]
    version = _run([installed / "prebake", "--version"], cwd=tmp_path, env=_env(tmp_path))
    assert version.stdout.startswith("prebake 0.")


def test_the_installed_plan_lists_the_shipped_recipe_and_recipes_folders_add(installed, tmp_path):
    extra = tmp_path / "more"
    extra.mkdir()
    (extra / "tiny-llama-copy.toml").write_text(
        (REPO / "recipes" / "tiny-llama.toml").read_text().replace('name = "tiny-llama"', 'name = "tiny-llama-copy"')
    )
    env = {**_env(tmp_path), "PREBAKE_RECIPES": str(extra)}
    for model in ("tiny-llama", "tiny-llama-copy"):
        out = _run([installed / "prebake", "plan", "--model", model, "--format", "json"], cwd=tmp_path, env=env)
        assert [t["status"] for t in json.loads(out.stdout)["targets"]] == ["missing", "missing"]


@pytest.mark.slow
def test_the_installed_wheel_bakes_a_recipe_outside_a_checkout(installed, tmp_path):
    """A user's recipe (the serving tests' two-layer model at one sequence, two step shapes, fp32 and
    bf16 in its matrix): the subject is the wheel outside a checkout; tiny-llama's seven shapes made
    this one of the suite's slowest calls (147 s under load) for nothing the wheel does differently."""
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "wheel-test", variant="aoti-package", seqs=1, dtype=("bf16", "fp32"))
    env = {**_env(tmp_path), "PREBAKE_RECIPES": str(recipes)}
    target = "wheel-test/cpu/tp1/fp32"
    bake = [installed / "prebake", "bake", "--model", "wheel-test", "--target", target]
    first = _run(bake, cwd=tmp_path, env=env)
    assert first.stdout.count(": published,") == 3, first.stdout
    plan = _run([installed / "prebake", "plan", "--model", "wheel-test", "--format", "json"], cwd=tmp_path, env=env)
    states = {t["id"]: t["status"] for t in json.loads(plan.stdout)["targets"]}
    assert states == {target: "present", "wheel-test/cpu/tp1/bf16": "missing"}
    again = _run(bake, cwd=tmp_path, env=env)  # nothing changed: every task is up to date
    assert "published" not in again.stdout and again.stdout.count("-- bake:") == 3, again.stdout


def _venv_of(root: Path, wheel: Path, extras: tuple[str, ...]) -> Path:
    """A fresh venv with the wheel, what it declares for `extras` (none: the bare wheel) and torch,
    nothing else, all `pip check`ed; its bin folder."""
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    with zipfile.ZipFile(wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        declared = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
    link_into(venv, closure([*declared, "torch"], extras).values())  # markers keep only these extras' requirements
    pip = [sys.executable, "-m", "pip", "--python", venv / "bin" / "python"]
    _run([*pip, "install", "-q", "--no-deps", wheel])
    _run([*pip, "check"])
    return venv / "bin"


@pytest.fixture(scope="module")
def bare(tmp_path_factory, wheel) -> Path:
    """The bare wheel (no extras) beside torch."""
    return _venv_of(tmp_path_factory.mktemp("bare"), wheel, ())


def test_the_demos_extras_bring_what_the_bundled_engine_bakes_and_serves_with(tmp_path_factory, wheel, tmp_path):
    """make demo installs prebake[torch,serve,gguf]: its build child, start-up, server, GGUF reader and the
    demo script import."""
    demo = _venv_of(tmp_path_factory.mktemp("demo"), wheel, ("torch", "serve", "gguf"))
    modules = "prebake.engine.bundled.build, prebake.engine.bundled.serve, prebake.engine.bundled.start, gguf"
    _run([demo / "python", "-c", f"import {modules}"], cwd=tmp_path, env=_env(tmp_path))
    _run([demo / "python", REPO / "benchmarks" / "startup.py", "--help"], cwd=tmp_path, env=_env(tmp_path))


def test_the_bare_wheel_holds_none_of_the_extras_packages(bare, tmp_path):
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = _run([bare / "python", "-c", probe, *EXTRAS_MODULES], cwd=tmp_path, env=_env(tmp_path))
    assert found.stdout.strip() == "[]"


def test_the_bare_wheel_fetches_a_folder_registrys_bundles(bare, tmp_path):
    registry = tmp_path / "registry"
    published = seed(registry, tmp_path / "scratch", plan_here("tiny-llama", "bf16"))
    fetch = [bare / "prebake", "fetch", "--model", "tiny-llama", "--precision", "bf16", "--registry", registry]
    done = _run([*fetch, "--json"], cwd=tmp_path, env=_env(tmp_path))
    report = json.loads(done.stdout)
    assert report["complete"] and report["misses"] == [], report
    assert {k: b["blob"] for k, b in report["bundles"].items()} == {k: m.blob.digest for k, m in published.items()}


@pytest.mark.parametrize(
    ("address", "module", "extra"),
    [("s3://team/prebake", "boto3", "s3"), ("hf://team/bundles", "huggingface_hub", "hf")]
    + [("oci://127.0.0.1:9/team/bundles", "httpx", "oci")],
)
def test_a_registry_without_its_extra_is_one_line_naming_the_extra(bare, tmp_path, address, module, extra):
    (tmp_path / "near").mkdir()  # a chain: the folder member opens, the far one names its extra
    done = subprocess.run(
        [bare / "prebake", "fetch", "--model", "tiny-llama", "--registry", f"{tmp_path / 'near'},{address}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(tmp_path),
        timeout=120,
    )
    scheme = address.split("//")[0] + "//"
    want = f"prebake: error: an {scheme} registry needs {module}: pip install 'prebake[{extra}]'"
    said = [line for line in done.stderr.splitlines() if "PREBAKE_TRUSTED_KEYS is not set" not in line]
    assert (done.returncode, said) == (2, [want]), done.stdout + done.stderr


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["serve", "--model", "tiny-llama"], "prebake serve needs fastapi: pip install 'prebake[serve]'"),
        (["preheat", "--mirror", "oci://127.0.0.1:9/a/b"], "prebake preheat needs httpx: pip install 'prebake[oci]'"),
    ],
)
def test_a_command_without_its_extra_is_one_line_naming_the_extra(bare, tmp_path, argv, line):
    done = subprocess.run([bare / "prebake", *argv], capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path))
    assert (done.returncode, done.stderr.splitlines()) == (2, [f"prebake: error: {line}"]), done.stdout + done.stderr


def test_a_torch_bake_without_the_torch_extra_names_it(bare, tmp_path):
    bake = [bare / "prebake", "bake", "--model", "tiny-llama", "--target", "tiny-llama/cpu/tp1/fp32"]
    done = subprocess.run(
        [*bake, "--registry", tmp_path / "registry"], capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path)
    )
    assert done.returncode != 0 and "Traceback" not in done.stdout + done.stderr
    assert "\nbaking autotune needs safetensors: pip install 'prebake[torch]'\n" in done.stdout + done.stderr
