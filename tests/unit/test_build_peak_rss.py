"""The graphs builder's peak_rss is the build child's own memory, not the process that started it:
across vfork/fork and exec Linux carries the parent's peak into ru_maxrss, so a build child started
by a test worker that had loaded a model reported the worker's gigabytes as its own (the 1B widths'
placeholder bound, tests/integration/test_model_sizes.py, failed that way)."""

import subprocess
import sys
import textwrap

import pytest

PARENT_HOLDS = 1536 * 2**20  # touched pages the starting process holds before it starts the child


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM is Linux's; elsewhere ru_maxrss stands")
def test_a_child_started_by_a_large_process_reports_its_own_peak():
    parent = textwrap.dedent(
        f"""
        import subprocess, sys
        held = bytearray({PARENT_HOLDS})
        for i in range(0, len(held), 4096):
            held[i] = 1
        child = "from prebake.engine.bundled.build import peak_rss; print(peak_rss())"
        print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout)
        """
    )
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True, timeout=300)
    child_peak = int(done.stdout.split()[-1])
    assert 0 < child_peak < PARENT_HOLDS / 2, child_peak  # the child imports torch: a few hundred MB, its own
