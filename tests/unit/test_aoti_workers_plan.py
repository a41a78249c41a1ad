"""How many worker processes an aoti-package compile takes (runtime.aoti_workers.plan_workers):
the least of the cores, the cores measured free, the shapes and what the available memory holds, and why."""

from __future__ import annotations

import os

from prebake.artifacts.recipe.schema import ModelSpec
from prebake.engine.bundled.runtime.aoti_workers import (
    ModelSource,
    available_bytes,
    free_cores,
    per_worker_bytes,
    plan_workers,
)

CONFIG = {"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1}
SOURCE = ModelSource(ModelSpec(name="m", config=CONFIG), "fp32", 1, 32)
GIB = 1 << 30


def test_the_cores_bound_the_workers_when_memory_and_shapes_allow_more():
    cores = len(os.sched_getaffinity(0))
    planned = plan_workers(
        SOURCE, model_bytes=GIB // 100, shapes=cores + 5, available=1000 * GIB, measure=lambda n: float(n)
    )
    assert planned.count == cores and planned.why == f"{cores} cores"


def test_cores_another_process_keeps_busy_do_not_count_and_one_left_compiles_in_this_process():
    assert free_cores(2, lambda n: 1.1) == (1, "1.10 of 2 cores free, measured")  # another bake on the other core
    assert free_cores(2, lambda n: 1.6)[0] == 2  # three quarters of a core each: both count
    assert free_cores(8, lambda n: 5.9)[0] == 7
    assert free_cores(8, lambda n: 0.2)[0] == 1  # never below one
    asked: list[int] = []

    def measure(threads: int) -> float:
        asked.append(threads)
        return 1.1

    if len(os.sched_getaffinity(0)) > 1:
        planned = plan_workers(SOURCE, model_bytes=0, shapes=4, available=1000 * GIB, measure=measure)
        assert (planned.count, planned.why) == (1, f"1.10 of {len(os.sched_getaffinity(0))} cores free, measured")
        assert asked == [len(os.sched_getaffinity(0))]


def test_an_explicit_worker_count_or_a_single_shape_measures_nothing():
    def measure(threads: int) -> float:
        raise AssertionError("measured")

    assert plan_workers(SOURCE, model_bytes=0, shapes=4, asked=2, available=1000 * GIB, measure=measure).count == 2
    assert plan_workers(SOURCE, model_bytes=0, shapes=1, available=1000 * GIB, measure=measure).count == 1


def test_memory_bounds_the_workers_to_what_it_holds_and_never_below_one():
    each = per_worker_bytes(4 * GIB)
    planned = plan_workers(SOURCE, model_bytes=4 * GIB, shapes=7, asked=8, available=2 * each + each // 2)
    assert planned.count == 2 and "GiB available" in planned.why
    assert plan_workers(SOURCE, model_bytes=4 * GIB, shapes=7, asked=8, available=GIB).count == 1


def test_no_more_workers_than_shapes_and_memory_read_from_meminfo(tmp_path):
    assert plan_workers(SOURCE, model_bytes=0, shapes=1, asked=4, available=1000 * GIB).count == 1
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert available_bytes(tmp_path / "meminfo") == 2048 * 1024
