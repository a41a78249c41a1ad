"""Which tests share a pytest-xdist worker: `make test` runs `pytest -n auto --dist loadscope
--no-loadscope-reorder`, and this module's scheduler hands out whole groups of tests.

A group is one test module: its tests run together on one worker, in their order, so its
module-scoped fixtures (servers, bakes) are set up once and no test waits on state another worker
holds. A session fixture several modules share and that costs minutes is made once a run by
whichever worker asks first (tests/support/once.py). Writes outside tmp_path are guarded where they
happen (tests/support/baking.wheel_build_lock).

Groups come from node ids, not `xdist_group` marks: pytest-xdist 3.8 writes a mark's group into
`item._nodeid`, which pytest 9 no longer reads. Two modules that share one bake a test of either
would disturb form one group (TOGETHER).

Groups are handed out longest first (the longest-processing-time rule): those COST names, by the
seconds each took in a full run; then the other groups holding slow tests; then the rest. COST only
orders: a stale figure costs balance at the end of a run, never a result. A serial run keeps
pytest's own order.
"""

from __future__ import annotations

import os

import pytest

# A snapshot restores only from the store it was dumped from (its image names the mapped files by
# path), so the two snapshot modules share one bake in place (support/snapshots.py) and run one after
# the other on one worker: the faults module's killed restore and changed weights never meet the
# other module's restores.
TOGETHER = {"tests/faults/test_snapshot_faults.py": "tests/integration/test_snapshot.py"}

# Seconds each of the longest groups took (its tests' setup, call and teardown summed, `--durations=0`)
# in the full run of 2026-12-05 (docs/development.md, "Wave 6's suite"; load 4-12 beside other work,
# so the figures are long: what counts is their order). The modules measured alone before and after
# torch's machine folder was linked back into each run's TMPDIR ("The machine folder") carry that
# run's figure times their after/before ratio.
COST = {
    "tests/integration/test_real_model.py": 929,
    "tests/integration/test_aoti_package.py": 558,
    "tests/integration/test_tensor_parallel_serve.py": 450,
    "tests/integration/test_bake.py": 286,
    "tests/integration/test_serve.py": 205,
    "tests/integration/test_remote_bake.py": 164,
    "tests/integration/test_snapshot.py": 163,  # with tests/faults/test_snapshot_faults.py (TOGETHER)
    "tests/integration/test_model_sizes.py": 155,
    "tests/integration/test_ray_fleet.py": 144,
    "tests/integration/test_aoti_workers.py": 141,
    "tests/operations/test_volumes.py": 117,
    "tests/integration/test_oci_bake.py": 114,
    "tests/integration/test_ci_workflow.py": 102,
    "tests/integration/test_traffic_serve.py": 92,
    "tests/integration/test_gpu_check.py": 72,
    "tests/contract/test_copy.py": 71,
    "tests/integration/test_precompile_fallback.py": 70,
    "tests/integration/test_fp8_package.py": 69,
    "tests/faults/test_crashes.py": 68,
    "tests/unit/test_bucket_conformance.py": 63,
    "tests/faults/test_fleet_node.py": 62,
    "tests/integration/test_kernel_threads.py": 61,
}


def group_of(nodeid: str) -> str:
    """The group of a test: its module, or the module it runs beside (TOGETHER)."""
    module = nodeid.split("::", 1)[0]
    return TOGETHER.get(module, module)


def handout_order(groups: list[str], slow: set[str]) -> list[str]:
    """`groups` longest first: those COST names by its figure, then the other slow ones, then the rest,
    each kind in the order given."""
    return sorted(groups, key=lambda group: (-COST.get(group, 0), group not in slow))


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
    """On the workers (whose collection order the scheduler follows): the groups in handout_order."""
    if not hasattr(config, "workerinput"):
        return
    slow = {group_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
    groups = list(dict.fromkeys(group_of(item.nodeid) for item in items))  # in collection order
    rank = {group: i for i, group in enumerate(handout_order(groups, slow))}
    items.sort(key=lambda item: rank[group_of(item.nodeid)])  # stable: each group keeps its order


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto`: one worker more than the CPUs this process may run on, at most 8 (each worker starts
    its own servers and, for the slow tests, its own compiles; the extra one runs while the others
    wait on a server's start, a deadline or a child's exit: on two cores 20 min 38 s -> 19 min 13 s
    quiet, docs/development.md); PYTEST_XDIST_AUTO_NUM_WORKERS wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return max(1, min(len(os.sched_getaffinity(0)) + 1, 8))
