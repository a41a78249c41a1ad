"""prebake from an installed wheel, outside any checkout: the shipped recipes, plan and bake.

The wheel is built from this tree and installed (without dependencies) into a fresh venv in a
temporary folder; the dependencies (torch, doit, ...) come from the test's own environment
through a path entry placed after the venv's site-packages, so every prebake module imported
comes from the wheel, never from the checkout.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.baking import REPO, wheel_build_lock


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
    assert "prebake/artifacts/bake/fetch.py" in names and "prebake/recipes/tiny-llama.toml" in names
    assert "prebake = prebake.engine.cli:main" in scripts


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
            "import prebake.artifacts, prebake.engine.cli, prebake.artifacts.bake.recipes as r; "
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
def test_the_installed_wheel_bakes_tiny_llama_outside_a_checkout(installed, tmp_path):
    env = _env(tmp_path)
    target = "tiny-llama/cpu/tp1/fp32"
    bake = [installed / "prebake", "bake", "--model", "tiny-llama", "--target", target]
    first = _run(bake, cwd=tmp_path, env=env)
    assert first.stdout.count(": published,") == 3, first.stdout
    plan = _run([installed / "prebake", "plan", "--model", "tiny-llama", "--format", "json"], cwd=tmp_path, env=env)
    states = {t["id"]: t["status"] for t in json.loads(plan.stdout)["targets"]}
    assert states == {target: "present", "tiny-llama/cpu/tp1/bf16": "missing"}
    again = _run(bake, cwd=tmp_path, env=env)  # nothing changed: every task is up to date
    assert "published" not in again.stdout and again.stdout.count("-- bake:") == 3, again.stdout
