"""benchmarks/gpu_check.py up to what needs a GPU: the wheel set (built from PyPI, under 64 MiB),
the offline install into a fresh venv with pip --no-index, and the CPU fallback of the whole check.

The wheelhouse is built once per module with `pip download` from PyPI (the only network the tests
use, as .ci/run allows), for this interpreter's Python: one Python's wheels fit under 64 MiB
(59 MB measured on 2026-12-01, numpy and botocore 17 MB each), two do not (85 MB), so a
wheelhouse is built for the GPU host's one Python (make gpu-wheelhouse GPU_PYTHONS=3.12).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check
from tests.support.baking import wheel_build_lock
from tests.support.serving import write_recipe

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheelhouse")
    with wheel_build_lock():  # it builds prebake's wheel from this checkout first
        report = gpu_check.build_wheelhouse(folder, [HERE])
    assert report["within_limit"], report
    return folder


def test_the_wheel_set_holds_prebake_and_every_runtime_dependency_under_64_mib(wheelhouse):
    report = gpu_check.wheelhouse_report(wheelhouse)
    assert report["bytes"] < 64 * 2**20 and report["wheels"] > len(gpu_check.runtime_requirements())
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheelhouse.glob("*.whl")}
    for requirement in gpu_check.runtime_requirements():
        name = requirement.split(">")[0].split("=")[0].split("[")[0].strip().lower().replace("_", "-")
        assert name in names, f"{name} has no wheel in the wheelhouse"
    assert "prebake" in names and "torch" not in names  # torch is the GPU host's own


def test_prebake_installs_into_a_fresh_venv_from_the_wheels_alone(wheelhouse, tmp_path):
    python = gpu_check.offline_venv(tmp_path / "venv", wheelhouse)  # pip --no-index: nothing downloaded
    done = subprocess.run(
        [
            str(python),
            "-c",
            "import prebake.engine.cli, prebake.artifacts.recipe.schema, prebake.registry, fastapi, zstandard; print('ok')",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert (python.parent / "prebake").is_file()


def test_a_checkout_without_its_wheelhouse_is_told_how_to_build_one(tmp_path):
    with pytest.raises(SystemExit, match="make gpu-wheelhouse"):
        gpu_check.offline_venv(tmp_path / "venv", tmp_path / "empty")


def test_a_recipe_that_is_not_there_is_refused_before_anything_is_installed(tmp_path):
    with pytest.raises(SystemExit, match="--recipe .*nope.toml: no such file; name a recipe .toml"):
        gpu_check.main(["--recipe", str(tmp_path / "nope.toml"), "--work", str(tmp_path / "work")])
    assert not (tmp_path / "work").exists()


def test_the_recipe_is_set_to_this_hosts_gpu(tmp_path):
    assert gpu_check.recipe_for("cuda:sm_90", tmp_path) == "tiny-llama"
    text = (tmp_path / "tiny-llama.toml").read_text()
    assert 'platform = ["cuda:sm_90"]' in text and 'platform = ["cpu"]' not in text


@pytest.mark.slow
def test_the_cpu_fallback_bakes_and_starts_cold_prebaked_and_eager_offline(wheelhouse, tmp_path):
    """The whole check on the CPU, from the wheels, with torch 'preinstalled': the project's torch,
    in a venv of its own as the CUDA images' is, seen through the .pth line offline_venv writes
    (prebake's dependencies still come from the wheelhouse: the venv is filled before it is linked). The bake, a cold
    start with --write-back, is the cold figure (--cold-from-bake): one compile, not two. The GPU
    check runs aoti-package (the default) and dynamo-precompile side by side; here the default alone, on
    the serving tests' two-layer recipe at one sequence (--recipe): tiny-llama's seven shapes made this the
    suite's slowest call (173 s under load) for nothing the check's steps do differently."""
    write_recipe(tmp_path / "source", "gpu-check-test", variant="aoti-package", seqs=1, dtype="bf16")
    work = tmp_path / "work"
    python = gpu_check.offline_venv(work / "venv", wheelhouse)
    facts = gpu_check.host_facts(python)
    assert facts["torch"].startswith("2.") and (facts["platform"] == "cpu" or facts["gpu"])
    assert gpu_check.GPU_VARIANTS == ("dynamo-precompile", "aoti-package")
    figures = gpu_check.check(
        python,
        {**facts, "platform": "cpu"},
        work,
        "bf16",
        cold_from_bake=True,
        variants=("aoti-package",),
        recipe=tmp_path / "source" / "gpu-check-test.toml",
    )
    assert figures["benchmark"] == "startup" and figures["precision"] == "bf16" and figures["cold_from_bake"]
    assert set(figures["ready_mean_s"]) == {"eager", "cold_aoti-package", "prebaked_aoti-package"}
    # the prebaked start loaded what the bake published: it compiled nothing (a bake whose write-back
    # went to quarantine instead of the benchmark's own index once made it compile everything again)
    assert "compile" in figures["steps_mean_s"]["cold_aoti-package"]
    assert "compile" not in figures["steps_mean_s"]["prebaked_aoti-package"], figures["steps_mean_s"]
    assert "package-load" in figures["parts_mean_s"]["prebaked_aoti-package"]
