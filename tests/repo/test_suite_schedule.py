"""The suite's schedule on pytest-xdist workers (tests/support/xdist_groups.py) names real modules and
hands the longest groups out first, so a renamed or removed module cannot leave its figure behind
unnoticed, and the order is the one the docs describe."""

from __future__ import annotations

from pathlib import Path

from tests.support.xdist_groups import COST, TOGETHER, group_of, handout_order

REPO = Path(__file__).resolve().parents[2]


def test_every_module_the_schedule_names_exists():
    named = {*COST, *TOGETHER, *TOGETHER.values()}
    missing = sorted(module for module in named if not (REPO / module).is_file())
    assert not missing, f"tests/support/xdist_groups.py names modules that are not there: {missing}"


def test_a_module_run_beside_another_is_in_its_group_and_has_no_figure_of_its_own():
    for module, beside in TOGETHER.items():
        assert group_of(f"{module}::test_x") == beside
        assert module not in COST, f"{module} runs in {beside}'s group: its seconds belong to that figure"


def test_the_longest_groups_go_out_first_then_the_slow_then_the_rest():
    longest, second = sorted(COST, key=COST.get, reverse=True)[:2]
    groups = ["tests/unit/test_a.py", "tests/integration/test_slow.py", second, longest, "tests/unit/test_b.py"]
    assert handout_order(groups, {"tests/integration/test_slow.py", longest}) == [
        longest,
        second,
        "tests/integration/test_slow.py",
        "tests/unit/test_a.py",
        "tests/unit/test_b.py",
    ]
