"""torch's and Inductor's once-per-process work on threads (prebake.engine.bundled.runtime.torch_import,
prebake.engine.bundled.runtime.inductor_init), run in a fresh interpreter each, as `prebake serve` runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _child(code: str, tmp_path: Path, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_torch_then_inductor_import_on_one_thread_and_each_join_says_what_it_waited(tmp_path):
    got = _child(
        "import json, sys\n"
        "from prebake.engine.bundled.runtime.torch_import import Imports\n"
        "job = Imports.begin(['torch._inductor.codecache'])\n"
        "note = job.join_torch()\n"
        "waited = job.join()\n"
        "print(json.dumps({'note': note, 'torch_s': job.torch_s, 'inductor_s': job.inductor_s, 'waited': waited,"
        " 'codecache': 'torch._inductor.codecache' in sys.modules}))",
        tmp_path,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    assert got["codecache"] and got["torch_s"] > 0 and got["inductor_s"] > 0 and got["waited"] >= 0
    assert got["note"].startswith("torch 2.") and "on a thread" in got["note"]


def test_a_failed_import_is_raised_where_the_start_joins_it(tmp_path):
    got = _child(
        "import json\n"
        "from prebake.engine.bundled.runtime.torch_import import Imports\n"
        "job = Imports.begin(['no_such_module_anywhere'])\n"
        "job.join_torch()\n"
        "try:\n"
        "    job.join()\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(json.dumps({'raised': str(exc)}))\n",
        tmp_path,
    )
    assert "no_such_module_anywhere" in got["raised"]


def test_inductor_init_picks_the_vector_isa_and_asks_the_compiler_before_any_kernel_loads(tmp_path):
    got = _child(
        "import json\n"
        "from prebake.engine.bundled.runtime.torch_import import Imports\n"
        "from prebake.engine.bundled.runtime.inductor_init import INDUCTOR_MODULES, InductorInit\n"
        "imports = Imports.begin(INDUCTOR_MODULES)\n"
        "imports.join_torch()\n"
        "init = InductorInit.start(imports).join()\n"
        "from torch._inductor import cpu_vec_isa\n"
        "print(json.dumps({'describe': init.describe(), 'isa': str(cpu_vec_isa.pick_vec_isa()),"
        " 'cached': cpu_vec_isa.valid_vec_isa_list.cache_info().currsize, 'imports_s': init.imports_s}))",
        tmp_path,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    assert got["cached"] == 1  # the ISA list was probed on the thread: the first kernel load finds it
    assert f"vector ISA {got['isa'] or 'none'}" in got["describe"] and got["imports_s"] > 0
    assert "waited for after the weights' load" in got["describe"]


def test_the_probes_begin_once_their_modules_are_in_beside_the_rest_and_warm_the_precompiled_header(tmp_path):
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(3)\n")  # stands for lowering's seconds
    got = _child(
        "import json\n"
        "from prebake.engine.bundled.runtime.torch_import import Imports\n"
        "from prebake.engine.bundled.runtime.inductor_init import PROBE_MODULES, InductorInit\n"
        "imports = Imports.begin([*PROBE_MODULES, 'slow_to_import'])\n"
        "imports.join_torch()\n"
        "init = InductorInit.start(imports).join()\n"
        "from torch._inductor import codecache\n"
        "print(json.dumps({'beside': init.probes_beside_imports, 'describe': init.describe(),"
        " 'headers': codecache._precompile_header.cache_info().currsize}))",
        tmp_path,
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}",
    )
    assert got["beside"], got["describe"]  # the probes ran while the slow module was still importing
    assert "beside the rest of them" in got["describe"] and "precompiled header ready" in got["describe"]
    assert got["headers"] == 1  # the first kernel load finds the header's preprocessing done


def test_waiting_for_modules_the_thread_does_not_import_is_refused_and_a_failed_import_is_raised():
    from prebake.engine.bundled.runtime.torch_import import Imports

    job = Imports.begin(["json", "no_such_module_anywhere"])
    with pytest.raises(ValueError, match="not among the modules"):
        job.wait_for(["csv"])
    with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
        job.wait_for(["no_such_module_anywhere"])
    job.wait_for(["json"])  # imported before the failure: no error for what was asked


def test_the_start_up_runs_under_a_short_switch_interval_and_puts_the_default_back_even_when_it_fails():
    from prebake.engine.bundled import start

    before = sys.getswitchinterval()
    with start._short_switch_interval():
        assert sys.getswitchinterval() == min(before, start._START_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError), start._short_switch_interval():
        raise RuntimeError("a start that fails")
    assert sys.getswitchinterval() == before
