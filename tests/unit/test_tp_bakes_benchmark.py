"""benchmarks/tp_bakes.py: the ABBA order of its rounds, and the medians its ratio is read from."""

from __future__ import annotations

from benchmarks import tp_bakes


def test_rounds_alternate_abba_so_a_drift_in_load_falls_on_both_sizes():
    assert tp_bakes.order(1, 2) == [1, 2]
    assert tp_bakes.order(3, 4) == [1, 4, 4, 1, 1, 4]


def test_the_ratio_is_of_medians_not_of_one_bake_each():
    bakes = [
        (1, {"compile_s": 66.0, "bundle_bytes": 100}),
        (2, {"compile_s": 56.0, "bundle_bytes": 101}),
        (2, {"compile_s": 55.0, "bundle_bytes": 101}),
        (1, {"compile_s": 46.0, "bundle_bytes": 100}),
    ]
    figures = tp_bakes.interleaved(bakes, 2)
    assert figures["median"] == {
        "1": {"compile_s": 56.0, "bundle_bytes": 100},
        "2": {"compile_s": 55.5, "bundle_bytes": 101},
    }
    assert figures["compile_over_tp1"] == round(55.5 / 56.0, 3)
    assert figures["bundle_over_tp1"] == 1.01
    assert [r["tp"] for r in figures["rounds"]] == [1, 2, 2, 1]


def test_the_recipe_bakes_tp_1_and_n():
    text = "[model]\nname = 'x'\n\n[matrix]\nplatform = ['cpu']\ntp = [1]\n"
    assert "tp = [1, 2]" in tp_bakes.with_tp(text, 2) and "tp = [1]\n" not in tp_bakes.with_tp(text, 2)
