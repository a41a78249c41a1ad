"""The GPU check's FP8 modes: run on GPUs of sm_89 and newer (the CPU fallback emulates), their recipes
written at the precision they bake."""

from __future__ import annotations

import tomllib

from benchmarks.gpu_check import FP8_RECIPES, fp8_ready, recipe_for


def test_fp8_modes_need_sm_89_and_say_so_below_it():
    assert fp8_ready({"platform": "cuda:sm_90"}) is None and fp8_ready({"platform": "cuda:sm_89"}) is None
    assert "sm_89 or newer" in fp8_ready({"platform": "cuda:sm_80"})
    assert fp8_ready({"platform": "cpu"}) is None  # the fallback: emulated, for the check's steps


def test_each_fp8_recipe_is_written_for_the_gpu_at_the_asked_precision(tmp_path):
    for source in FP8_RECIPES:
        name = recipe_for("cuda:sm_90", tmp_path, source, ("fp8",))
        matrix = tomllib.loads((tmp_path / source.name).read_text())["matrix"]
        assert matrix["platform"] == ["cuda:sm_90"] and matrix["dtype"] == ["fp8"] and name
