"""A start's and a bake's temporary files live in their scratch folder of the store (issue 49 item 8)."""

from __future__ import annotations

import os
import tempfile

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
