"""Inductor's vector-ISA probes compiled once a machine (runtime.isa_probes), with torch's real probes
and the real compiler: two processes that start at once on a machine with no set both compile, one
publishes; a third copies the set into its own cache folder, runs no compile, and torch picks the same
ISA (it still dlopens every library itself). A compiler shim (CXX) counts the compiles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prebake.engine.bundled.runtime import isa_probes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
CHILD = (
    "import json, sys; from pathlib import Path\n"
    "from prebake.engine.bundled.runtime import isa_probes\n"
    "from torch._inductor import cpu_vec_isa\n"
    "settled = isa_probes.settle(root=Path(sys.argv[1]))\n"
    "print('RESULT ' + json.dumps({'source': settled.source, 'isa': settled.isa,"
    " 'valid': [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]}))\n"
)


def _shim(tmp_path: Path) -> tuple[Path, Path]:
    """A C++ compiler that logs each compile (a call naming an output) and runs the real one."""
    real = shutil.which("g++")
    if real is None:
        pytest.skip("needs g++ (Inductor's CPU compiler)")
    log, shim = tmp_path / "compiles.log", tmp_path / "g++-shim"
    shim.write_text(f'#!/bin/sh\ncase " $* " in *" -o "*) echo "$*" >> {log} ;; esac\nexec {real} "$@"\n')
    shim.chmod(0o755)
    return shim, log


def _start(tmp_path: Path, name: str, root: Path, shim: Path) -> subprocess.Popen:
    env = {**os.environ, "CXX": str(shim), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / name), "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, out + err
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT ")).split(" ", 1)[1])


def test_the_probes_compile_once_a_machine_and_torch_decides_the_same_from_the_copied_set(tmp_path):
    shim, log = _shim(tmp_path)
    root = tmp_path / "machine"
    first, second = (_result(p) for p in [_start(tmp_path, "a", root, shim), _start(tmp_path, "b", root, shim)])
    sources = sorted([first["source"], second["source"]])
    assert sources[0].startswith("compiled") and sources[1].startswith("compiled")
    assert "compiled and published for the machine" in sources, sources
    compiles = log.read_text().splitlines()
    assert compiles and all(".so" in line for line in compiles)
    [published] = [p for p in root.iterdir() if not p.name.startswith(".")]
    assert isa_probes._verified(published) is not None

    log.unlink()
    third = _result(_start(tmp_path, "c", root, shim))
    assert third["source"] == "seeded"
    assert not log.exists(), "a seeded probe compiled:\n" + log.read_text()
    assert (third["isa"], third["valid"]) == (first["isa"], first["valid"]) == (second["isa"], second["valid"])
    assert isa_probes._probe_files(tmp_path / "c") == isa_probes._probe_files(tmp_path / "a")
