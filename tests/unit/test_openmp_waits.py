"""The serving process's OpenMP waits (runtime.openmp): a short spin set before torch loads libgomp,
an operator's own choice kept, nothing claimed once libgomp has read its variables."""

from __future__ import annotations

import subprocess
import sys

from prebake.engine.bundled.runtime import openmp


def test_the_operators_wait_policy_or_spin_count_is_kept():
    for chosen in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "0"}):
        environ = dict(chosen)
        openmp.brief_waits(environ)
        assert environ == chosen
        assert openmp.waits(environ) == "OpenMP waits " + ", ".join(f"{k}={v}" for k, v in chosen.items())


def test_nothing_is_set_once_torch_has_loaded_libgomp_and_the_log_says_so():
    code = (
        "import os, torch\n"
        "from prebake.engine.bundled.runtime import openmp\n"
        "openmp.brief_waits()\n"
        "print(openmp.SPIN_ENV in os.environ, openmp.waits())\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "False OpenMP waits as libgomp's default (a long spin)"


def test_a_fresh_process_sets_it_before_torch_is_imported():
    code = "from prebake.engine.bundled.runtime import openmp\nopenmp.brief_waits()\nprint(openmp.waits())\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={}, check=True)
    assert done.stdout.strip() == f"OpenMP waits {openmp.SPIN_ENV}={openmp.SERVING_SPIN_COUNT}"
