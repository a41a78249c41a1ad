"""Autotune measures robustly (issue 36, item 5): tactics timed interleaved, medians, a winner inside
the noise recorded as a tie (the default kept), the conditions recorded and shown by listings."""

from __future__ import annotations

import json
import os
import time

from prebake.artifacts.recipe.schema import AutotuneSpec
from prebake.engine.bundled.adapter import autotune_labels
from prebake.engine.bundled.runtime.autotune import SERVING_HOST, measure, verdict, winners
from prebake.engine.bundled.runtime.shapes import StepShape
from prebake.engine.bundled.runtime.steps import Tactic

SHAPE = StepShape("decode", 1, 1, 16)
SDPA, MATMUL = Tactic("sdpa"), Tactic("matmul")


class BurstThenQuiet:
    """Steps whose runs take 20 ms while a burst of load lasts (the first `burst` runs), then 1 ms,
    whatever the tactic: the only difference between tactics is when they were timed."""

    def __init__(self, burst: int):
        self.calls, self.burst, self.order = 0, burst, []

    def run_dummy(self, shape, tactic):
        self.order.append(tactic.attn_impl)
        time.sleep(0.02 if self.calls < self.burst else 0.001)
        self.calls += 1


def test_a_load_burst_that_ends_midway_is_a_tie_not_a_win_for_the_tactic_timed_after_it():
    spec = AutotuneSpec(tactics=("attn_impl",), warmup=0, iterations=6)
    steps = BurstThenQuiet(burst=6)  # one tactic timed after another would see all slow, then all fast
    document = measure(steps, [SHAPE], spec, log=lambda line: None)  # type: ignore[arg-type]
    row = document["shapes"][0]
    assert steps.order[:4] == ["sdpa", "matmul", "matmul", "sdpa"]  # interleaved, the order rotated
    assert row["tie"] is True and row["winner"] == {"attn_impl": "sdpa"}  # the default kept, not claimed
    assert set(row["spread_ms"]) == {"attn_impl=sdpa", "attn_impl=matmul"}


def test_a_winner_outside_the_noise_is_kept_and_one_inside_it_is_a_tie():
    clear = verdict([SDPA, MATMUL], {"attn_impl=sdpa": [5.0, 5.2, 5.1, 5.3], "attn_impl=matmul": [2.0, 2.1, 2.2, 2.0]})
    assert clear["winner"] == {"attn_impl": "matmul"} and clear["tie"] is False
    noisy = verdict([SDPA, MATMUL], {"attn_impl=sdpa": [2.2, 3.0, 2.4, 9.0], "attn_impl=matmul": [2.0, 2.9, 2.1, 8.0]})
    assert noisy["fastest"] == "attn_impl=matmul" and noisy["tie"] is True and noisy["winner"] == {"attn_impl": "sdpa"}


def test_the_conditions_are_recorded_and_a_listing_shows_them(tmp_path):
    spec = AutotuneSpec(tactics=("attn_impl", "threads"), warmup=1, iterations=3)
    document = measure(BurstThenQuiet(burst=0), [SHAPE], spec, log=lambda line: None)  # type: ignore[arg-type]
    conditions = document["conditions"]
    assert conditions["cpus"] == os.cpu_count() and conditions["affinity"] == sorted(os.sched_getaffinity(0))
    assert len(conditions["load_average"]) == 3 and conditions["order"] == "interleaved"
    assert document["threads"] == SERVING_HOST  # the thread count is no tactic
    (tmp_path / "autotune.json").write_text(json.dumps(document))
    labels = autotune_labels(tmp_path)
    assert labels["autotune.cpus"] == str(os.cpu_count()) and labels["autotune.ties"].endswith("/1")
    assert labels["autotune.load_average"] and labels["autotune.widest_spread"].endswith("%")


def test_a_thread_count_an_older_autotune_file_chose_is_not_applied():
    old = {"shapes": [{"shape": vars(SHAPE), "winner": {"attn_impl": "matmul", "threads": 1}}]}
    assert winners(old) == {SHAPE: MATMUL}
