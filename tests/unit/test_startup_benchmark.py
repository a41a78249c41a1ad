"""benchmarks/startup.py's figures: the steps and warm-up parts of every mode, and what a prebaked
start spends beyond an eager one, and each bake against dynamo-precompile's, from runs (no engine is
started here)."""

from __future__ import annotations

import argparse
import json
import tomllib

import pytest

from benchmarks.startup import (
    Bench,
    Run,
    _startup_steps,
    _variants,
    _warm_up_parts,
    _with_dtype,
    bake_summary,
    beyond_eager,
    summarise,
)
from tests.support.baking import REPO

METRICS = """\
# HELP prebake_startup_step_seconds Seconds each start-up step took.
prebake_startup_step_seconds{step="torch"} 1.5
prebake_startup_step_seconds{step="warm-up"} 3.0
prebake_startup_part_seconds{part="inductor-init"} 1.75
prebake_startup_part_seconds{part="kernels"} 0.5
"""


def test_steps_and_parts_are_read_from_the_engines_metrics():
    assert _startup_steps(METRICS) == {"torch": 1.5, "warm-up": 3.0}
    assert _warm_up_parts(METRICS) == {"inductor-init": 1.75, "kernels": 0.5}


def test_what_a_prebaked_start_spends_beyond_eager_is_split_by_step_and_part():
    runs = [
        Run("eager", "dynamo-precompile", 5.0, 0.1, {"torch": 1.0, "load": 2.0, "warm-up": 0.2}, {"first-runs": 0.2}),
        Run("cold", "dynamo-precompile", 100.0, 0.1, {"torch": 1.0, "compile": 95.0}),
        Run(
            "prebaked",
            "dynamo-precompile",
            8.0,
            0.1,
            {"torch": 1.5, "load": 2.0, "warm-up": 3.0},
            {"inductor-init": 1.7, "kernels": 0.6, "first-runs": 0.3},
        ),
    ]
    summary = summarise(runs, ("dynamo-precompile",))
    assert round(summary["dynamo-precompile"]["compile_overhead_removed"]["mean"], 4) == round(92 / 95, 4)
    beyond = beyond_eager(summary["dynamo-precompile"]["prebaked"], summary["eager"])
    assert beyond["torch"] == 0.5 and beyond["load"] == 0.0 and beyond["warm-up"] == 2.8
    assert beyond["warm-up:inductor-init"] == 1.7 and beyond["warm-up:first-runs"] == 0.1
    # outside any step: the interpreter, prebake's imports, the HTTP server (8 - 6.5 against 5 - 3.2)
    assert beyond["outside steps"] == -0.3


def test_precision_fp8_adds_fp8_to_the_recipe_copys_dtype_lists_and_leaves_a_shipped_one_alone():
    smollm2 = (REPO / "recipes" / "smollm2-135m.toml").read_text()
    llama8b = (REPO / "recipes" / "llama3-8b.toml").read_text()

    assert tomllib.loads(_with_dtype(smollm2, "fp8"))["matrix"]["dtype"] == ["fp32", "bf16", "fp8"]
    assert _with_dtype(smollm2, "bf16") == smollm2 and _with_dtype(llama8b, "fp8") == llama8b


def test_variant_takes_one_name_several_joined_by_commas_or_a_set_name():
    assert _variants("aoti-package") == ("aoti-package",)
    assert _variants("dynamo-precompile,aoti-package") == ("dynamo-precompile", "aoti-package")
    assert _variants("both") == ("inductor-cache", "dynamo-precompile")
    assert _variants("all") == ("inductor-cache", "dynamo-precompile", "aoti-package")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown variant.*aoti; use inductor-cache"):
        _variants("aoti")


def test_each_bakes_compile_step_and_graphs_bundle_are_reported_against_dynamo_precompiles(tmp_path):
    bench = Bench(tmp_path, "tiny-llama", "bf16")
    for variant, size, compile_s in (("dynamo-precompile", 1_200_000, 120.0), ("aoti-package", 480_000, 72.0)):
        index = bench.registry(variant) / "index" / "graphs"
        index.mkdir(parents=True)
        (index / "abc.json").write_text(json.dumps({"kind": "graphs", "blob": {"digest": "sha256:0", "size": size}}))
        bench.bakes[variant] = Run("cold", variant, compile_s + 10, 0.1, {"compile": compile_s, "build": 5.0})
    bakes = bake_summary(bench, ("dynamo-precompile", "aoti-package"))
    assert bakes["compile_s"] == {"dynamo-precompile": 120.0, "aoti-package": 72.0}
    assert bakes["compile_over_precompile"] == {"aoti-package": 0.6}
    assert bakes["bundle_bytes"] == {"dynamo-precompile": 1_200_000, "aoti-package": 480_000}
    assert bakes["bundle_over_precompile"] == {"aoti-package": 0.4}
    # a variant given a registry baked elsewhere (--registry) has its bundle's size but no bake of its own
    assert bake_summary(bench, ("aoti-package",))["compile_over_precompile"] == {}
