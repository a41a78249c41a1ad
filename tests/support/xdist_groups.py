"""Which tests share a pytest-xdist worker: `make test` runs
`pytest -n auto --dist loadscope --no-loadscope-reorder`, and this module's scheduler hands out
whole groups of tests.

A group is one test module: its tests run together on one worker, in their order, as in a serial
run, so its module-scoped fixtures (servers, bakes) are set up once and no test waits on state
another worker holds. A session fixture several modules share and that costs minutes is made once
a run whichever worker asks first (tests/support/once.py), so those modules need no worker of their
own. What tests write outside their tmp_path is guarded where it is written
(tests/support/baking.wheel_build_lock: pip building prebake's wheel in the checkout's build/ folder).

The groups are computed from node ids by the scheduler itself rather than through
`xdist_group` marks: pytest-xdist 3.8 writes a mark's group into `item._nodeid`, which pytest 9
no longer reads, so marks do not group anything there.

Modules that hold slow tests (the ones that compile) are handed out first, so the longest groups
do not start last and leave one worker idle at the end; a serial run keeps pytest's own order.
"""

from __future__ import annotations

import os

import pytest


def group_of(nodeid: str) -> str:
    """The group of a test: its module."""
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With --dist loadscope: whole groups to a worker, in collection order with
    --no-loadscope-reorder (as `make test` runs it). Other --dist modes keep xdist's schedulers."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the workers (whose collection order the scheduler follows): groups holding slow tests first."""
    if not hasattr(config, "workerinput"):
        return
    slow = {group_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: group_of(item.nodeid) not in slow)  # stable: each group keeps its order


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker per CPU this process may run on, at most 8 (each worker starts its own
    servers and, for the slow tests, its own compiles); PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return max(1, min(len(os.sched_getaffinity(0)), 8))
