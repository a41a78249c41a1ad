"""A start's and a bake's temporary files live in their scratch folder of the store (issue 49 item 8)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from prebake.engine.bundled.adapter import child_env
from prebake.engine.bundled.cache_layout import private_temp


def test_a_start_sends_its_temporary_files_into_its_run_folder_until_it_closes(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "system"))
    before = tempfile.tempdir
    restore = private_temp(tmp_path / "run")
    try:
        assert os.environ["TMPDIR"] == str(tmp_path / "run" / "tmp") == tempfile.gettempdir()
        made = tempfile.mkdtemp(prefix="aotinductor_")  # as torch's package loader does, by TMPDIR
        assert made.startswith(str(tmp_path / "run" / "tmp") + os.sep)
    finally:
        restore()
    assert os.environ["TMPDIR"] == str(tmp_path / "system") and tempfile.tempdir == before


def test_a_build_child_gets_a_temporary_folder_in_its_scratch_folder(tmp_path):
    env = child_env("graphs", tmp_path / "scratch" / "tree", base={"TMPDIR": "/tmp"})
    assert env["TMPDIR"] == str(tmp_path / "scratch" / "tmp") and (tmp_path / "scratch" / "tmp").is_dir()


def test_torchs_machine_folder_stays_the_machines_under_a_run_folders_temporary_folder(tmp_path, monkeypatch):
    """Inductor's precompiled headers and the vector-ISA probe sets live in torch's machine folder,
    found by TMPDIR: a start's or a build's own TMPDIR links it, so they outlive the run folder."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from prebake.artifacts.store.sealing import remove
    from prebake.engine.bundled.runtime.isa_probes import machine_root

    (tmp_path / "system").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "system"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read again from TMPDIR
    restore = private_temp(tmp_path / "run")
    try:
        machine = Path(default_cache_dir())  # what torch resolves under the run's TMPDIR
        assert machine.parent == tmp_path / "run" / "tmp" and machine.is_symlink()
        assert machine.resolve() == tmp_path / "system" / machine.name
        assert machine_root().resolve().parent == tmp_path / "system" / machine.name
        (machine / "precompiled_headers").mkdir()
        child = child_env("graphs", tmp_path / "build" / "tree")  # a build started from the run: the same folder
        assert (Path(child["TMPDIR"]) / machine.name).resolve() == tmp_path / "system" / machine.name
    finally:
        restore()
    remove(tmp_path / "run")
    remove(tmp_path / "build")
    assert not (tmp_path / "run").exists() and (tmp_path / "system" / machine.name / "precompiled_headers").is_dir()
