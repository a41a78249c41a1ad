"""The serving process's OpenMP waits (runtime.openmp): chosen on the serving host before torch loads
libgomp, from how much CPU its threads measured (libgomp's long spin where each has a core, a short
spin where they share), an operator's own choice kept, nothing claimed once libgomp has read its
variables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from prebake.engine.bundled.runtime import openmp


def test_threads_with_a_core_each_keep_libgomps_long_spin_and_sharing_threads_get_a_short_one():
    assert openmp.decide(2, 1.9).chosen == {}
    assert openmp.decide(4, 3.0).chosen == {}  # three quarters of a core each
    assert openmp.decide(2, 0.98).chosen == {openmp.SPIN_ENV: openmp.SHORT_SPIN_COUNT}
    assert openmp.decide(8, 5.9).chosen == {openmp.SPIN_ENV: openmp.SHORT_SPIN_COUNT}
    assert openmp.decide(2, 0.98).line() == (
        "OpenMP waits GOMP_SPINCOUNT=1000: 2 threads got 0.98 cores, sharing them (a short spin, then sleep)"
    )
    assert (
        openmp.decide(2, 1.9).line()
        == "OpenMP waits as libgomp's default (a long spin): 2 threads got 1.90 cores, a core each"
    )


def test_the_threads_it_probes_are_the_ones_openmp_will_run():
    assert openmp.threads_wanted({"OMP_NUM_THREADS": "3,2"}) == 3  # nested levels: the outer one
    assert openmp.threads_wanted({}) == len(os.sched_getaffinity(0))
    assert openmp.threads_wanted({"OMP_NUM_THREADS": "many"}) == len(os.sched_getaffinity(0))


def test_the_probe_measures_cpu_time_over_wall_time():
    assert 0.0 < openmp.cores_got(1, seconds=0.05) <= 1.2  # one thread cannot get more than a core


def test_the_cores_are_measured_while_the_start_imports_one_thread_counted_by_its_schedstat():
    """A forked child runs one busy thread, the parent's busy loop (a start's imports) is the other."""
    code = (
        "import time\n"
        "from prebake.engine.common import cores\n"
        "began = cores.begin({'OMP_NUM_THREADS': '2'}, seconds=0.1)\n"
        "end = time.perf_counter() + 0.15\n"
        "while time.perf_counter() < end:\n"
        "    pass\n"
        "print(began, cores.collect(2), cores.collect(3))\n"
    )
    began, got, other = _in_a_fresh_process(code).split()
    assert began == "True" and other == "None"  # measured for two threads, not three
    assert 0.0 < float(got) <= 2.2  # two threads, each at most a core


def test_no_share_is_told_of_an_importing_thread_that_slept_and_none_is_begun_where_nothing_would_be_chosen():
    code = (
        "import time\n"
        "from prebake.engine.common import cores\n"
        "print(cores.begin({'OMP_NUM_THREADS': '1'}), cores.begin({'OMP_NUM_THREADS': '2', 'GOMP_SPINCOUNT': '0'}))\n"
        "began = cores.begin({'OMP_NUM_THREADS': '2'}, seconds=0.1)\n"
        "time.sleep(0.15)\n"
        "print(began, cores.collect(2))\n"
    )
    assert _in_a_fresh_process(code).splitlines() == ["False False", "True None"]


def test_the_start_takes_what_was_measured_as_it_imported_instead_of_probing_again():
    code = (
        "import os\n"
        "from prebake.engine.common import cores\n"
        "from prebake.engine.bundled.runtime import openmp\n"
        "cores.collect = lambda threads: 0.9 if threads == 2 else None\n"
        "openmp.cores_got = lambda *a: 1 / 0\n"
        "said = openmp.choose_waits()\n"
        "print(os.environ.get(openmp.SPIN_ENV), said.line())\n"
    )
    assert _in_a_fresh_process(code, OMP_NUM_THREADS="2") == (
        "1000 OpenMP waits GOMP_SPINCOUNT=1000: 2 threads got 0.90 cores, sharing them (a short spin, then sleep); "
        "measured as the start imported"
    )


def test_one_thread_has_no_peer_to_wait_for_and_is_not_probed():
    environ = {"OMP_NUM_THREADS": "1"}
    waits = openmp.choose_waits(environ, probe=lambda threads: pytest.fail("probed one thread"))
    assert environ == {"OMP_NUM_THREADS": "1"} and waits.reason == "one thread, nothing waits for a peer"


def test_the_operators_wait_policy_or_spin_count_is_kept():
    for chosen in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "0"}):
        environ = dict(chosen)
        waits = openmp.choose_waits(environ, probe=lambda threads: pytest.fail("probed an operator's choice"))
        assert environ == chosen
        assert waits.line() == "OpenMP waits " + ", ".join(f"{k}={v}" for k, v in chosen.items()) + ": the operator's"


def _in_a_fresh_process(code: str, *pinned: str, **env: str) -> str:
    done = subprocess.run(
        [*pinned, sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **env}
    )  # fmt: skip
    return done.stdout.strip()


def test_nothing_is_set_once_torch_has_loaded_libgomp_and_the_log_says_so():
    code = (
        "import os, torch\n"
        "from prebake.engine.bundled.runtime import openmp\n"
        "openmp.choose_waits()\n"
        "print(openmp.SPIN_ENV in os.environ, openmp.waits())\n"
    )
    assert _in_a_fresh_process(code) == (
        "False OpenMP waits as libgomp's default (a long spin): torch was imported before the start could choose"
    )


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux) to pin two threads to one core")
def test_two_threads_pinned_to_one_core_share_it_and_get_the_short_spin_before_torch_is_imported():
    code = (
        "import os\n"
        "from prebake.engine.bundled.runtime import openmp\n"
        "openmp.choose_waits()\n"
        "print(os.environ.get(openmp.SPIN_ENV), openmp.waits())\n"
    )
    first = str(min(os.sched_getaffinity(0)))
    out = _in_a_fresh_process(code, "taskset", "-c", first, OMP_NUM_THREADS="2")
    assert out.startswith("1000 OpenMP waits GOMP_SPINCOUNT=1000: 2 threads got "), out
    assert out.endswith("cores, sharing them (a short spin, then sleep)"), out


def test_a_snapshots_process_loads_libgomp_with_the_long_spin_unless_the_operator_chose(monkeypatch):
    monkeypatch.setattr(openmp, "_chosen", None)  # put back after: this process's start line says its own
    assert openmp.for_snapshot({}) == {openmp.SPIN_ENV: openmp.LONG_SPIN_COUNT, openmp.SNAPSHOT_ENV: "1"}
    said = openmp.choose_waits(dict(openmp.for_snapshot({})), probe=lambda threads: 0.0)
    assert said.chosen == {openmp.SPIN_ENV: openmp.LONG_SPIN_COUNT} and "snapshot" in said.reason
    assert openmp.for_snapshot({"OMP_WAIT_POLICY": "passive", "HOME": "/"}) == {"OMP_WAIT_POLICY": "passive"}


def test_a_restored_process_chooses_on_the_serving_host_and_shortens_the_long_spin_where_threads_share(monkeypatch):
    monkeypatch.setattr(openmp, "_chosen", None)  # put back after: this process's start line says its own
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    shortened: list[str] = []
    free = openmp.restored_waits({}, probe=lambda threads, seconds: 1.9, shorten=lambda: shortened.append("free"))
    assert shortened == [] and free.chosen == {}
    shared = openmp.restored_waits({}, probe=lambda threads, seconds: 0.9, shorten=lambda: shortened.append("shared"))
    assert shortened == ["shared"]
    assert shared.line() == (
        "OpenMP waits GOMP_SPINCOUNT=100, libgomp's throttled count (an idle second pool): "
        "2 threads got 0.90 cores, sharing them (a short spin, then sleep)"
    )
    assert openmp.waits() == shared.line()


def test_a_restored_process_takes_what_the_restoring_process_measured_for_as_many_threads(monkeypatch):
    monkeypatch.setattr(openmp, "_chosen", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    shortened: list[bool] = []
    fail = lambda threads, seconds: pytest.fail("probed what was handed over")  # noqa: E731
    shared = openmp.restored_waits({}, fail, partial(shortened.append, True), handed={"threads": 2, "got": 0.9})
    assert shortened == [True] and shared.chosen == {openmp.SPIN_ENV: openmp.THROTTLED}
    assert shared.reason.endswith(
        "sharing them (a short spin, then sleep); measured by the restoring process as it imported"
    )
    probed: list[float] = []
    other = openmp.restored_waits({}, lambda t, s: probed.append(s) or 1.9, handed={"threads": 4, "got": 0.9})
    assert probed == [openmp.RESTORE_PROBE_SECONDS] and other.chosen == {}  # measured for other threads: probed


def test_a_restored_process_follows_the_serving_hosts_operator_as_near_as_it_can(monkeypatch):
    monkeypatch.setattr(openmp, "_chosen", None)
    for given, shortens in (
        ({"OMP_WAIT_POLICY": "passive"}, True),
        ({"GOMP_SPINCOUNT": "1000"}, True),
        ({"OMP_WAIT_POLICY": "active"}, False),
        ({"GOMP_SPINCOUNT": "300000"}, False),
    ):
        shortened: list[bool] = []
        waits = openmp.restored_waits(
            given, probe=lambda threads, seconds: pytest.fail("probed an operator's choice"), shorten=partial(shortened.append, True)
        )  # fmt: skip
        assert shortened == ([True] if shortens else []), given
        assert waits.reason.startswith("the operator's"), waits.reason


def test_the_idle_second_pool_is_a_thread_and_its_openmp_worker_that_sleep():
    """Real torch and libgomp, in a fresh process: the serving thread's pool first (a warm engine's),
    then the held one beside it: two threads more, neither running."""
    code = (
        "import os, time, torch\n"
        "from prebake.engine.bundled.runtime import openmp\n"
        "torch.ones(1 << 20).add_(1)\n"
        "tasks = lambda: {t: open(f'/proc/self/task/{t}/stat').read().rsplit(')', 1)[1].split()[0] for t in os.listdir('/proc/self/task')}\n"
        "before = tasks()\n"
        "openmp.hold_second_pool()\n"
        "time.sleep(0.2)\n"
        "added = {t: state for t, state in tasks().items() if t not in before}\n"
        "print(len(added), sorted(set(added.values())))\n"
    )  # fmt: skip
    repo = str(Path(openmp.__file__).resolve().parents[3])
    assert _in_a_fresh_process(code, OMP_NUM_THREADS="2", PYTHONPATH=repo) == "2 ['S']"
