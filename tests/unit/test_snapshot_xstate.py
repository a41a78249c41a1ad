"""AMX's permission, recorded at the park and asked for again once restored (snapshot/xstate.py):
CRIU 4.1 restores neither it nor the tiles, and a restored process that had it dies by SIGILL at its
next AMX instruction. The restore itself runs through CRIU on a host with AMX (skipped elsewhere)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prebake.engine.bundled.snapshot import xstate
from prebake.engine.bundled.snapshot.host import Able, can_snapshot


def test_nothing_is_asked_for_when_the_parked_process_had_no_amx():
    assert isinstance(xstate.permitted(), int)
    assert xstate.ask_again(0) is None


def _has_amx() -> bool:
    cpuinfo = Path("/proc/cpuinfo")
    return cpuinfo.exists() and "amx_tile" in cpuinfo.read_text()


CHILD = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from prebake.engine.bundled.snapshot import xstate

    a, b = torch.randn(64, 512).bfloat16(), torch.randn(512, 512).bfloat16()
    before = a @ b  # oneDNN's AMX kernel: the process asks for the tile data here
    amx = xstate.permitted()
    print("parked", bool(amx & (1 << xstate.XTILEDATA)), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.02)
    if sys.argv[2] == "ask":
        print("asked", xstate.ask_again(amx), flush=True)
    print("equal", bool(torch.equal(a @ b, before)), flush=True)
    """
)


@pytest.mark.skipif(not _has_amx(), reason="this CPU lacks AMX (amx_tile)")
@pytest.mark.parametrize("ask", [False, True])
def test_a_restored_process_that_used_amx_dies_unless_it_asks_again(tmp_path, ask):
    able = can_snapshot()
    if not isinstance(able, Able):
        pytest.skip(f"no CRIU here: {able.reason}")
    go, images, out = tmp_path / "go", tmp_path / "images", tmp_path / "out.txt"
    images.mkdir()
    argv = [sys.executable, "-c", CHILD, str(go), "ask" if ask else "no"]
    with out.open("w") as sink:
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while "parked" not in out.read_text() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if "parked False" in out.read_text():
            pytest.skip("this CPU lacks AMX as oneDNN sees it: torch's bf16 matmul did not ask for the tiles")
        dump = [str(able.criu), "dump", "-t", str(child.pid), "-D", str(images), "-o", "dump.log"]
        assert subprocess.run(dump, capture_output=True).returncode == 0, (images / "dump.log").read_text()[-2000:]
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
    go.touch()
    restore = [
        str(able.unshare),
        "-pf",
        "--mount-proc",
        "--kill-child",
        str(able.criu),
        "restore",
        "-D",
        ".",
        "-o",
        "restore.log",
    ]
    subprocess.run(restore, cwd=images, capture_output=True, timeout=120)
    said = out.read_text()
    if ask:
        assert "asked None" in said and "equal True" in said, said
    else:
        assert "equal" not in said, said  # SIGILL at the first AMX instruction: CRIU dropped the permission
