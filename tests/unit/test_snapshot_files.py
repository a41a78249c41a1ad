"""What a snapshot depends on: the files its process maps (checked by digest, cached by stat), the
carried files put back only inside the temporary folder, and a host without CRIU said plainly."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from prebake.artifacts.errors import BundleError
from prebake.engine.bundled.snapshot import host
from prebake.engine.bundled.snapshot.files import DigestCache, FileRecord, first_difference, mapped_files, record
from prebake.engine.bundled.snapshot.image import CARRIED_DIR, put_back


def test_a_file_with_other_bytes_of_the_same_size_is_named(tmp_path):
    lib = tmp_path / "libweights.bin"
    lib.write_bytes(b"a" * 4096)
    cache = DigestCache(tmp_path / "digests.json")
    records = record([str(lib)], cache)
    assert first_difference(records, DigestCache(tmp_path / "digests.json")) is None
    lib.write_bytes(b"b" + b"a" * 4095)
    differs = first_difference(records, DigestCache(tmp_path / "digests.json"))
    assert differs is not None and differs.path == str(lib) and "other bytes" in differs.why


def test_a_missing_or_resized_file_is_named(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"x" * 10)
    records = record([str(lib)], DigestCache(tmp_path / "d.json"))
    lib.write_bytes(b"x" * 11)
    assert "11 bytes here, 10 at the bake" in first_difference(records, DigestCache(tmp_path / "d.json")).explain()
    lib.unlink()
    assert "missing on this host" in first_difference(records, DigestCache(tmp_path / "d.json")).explain()


def test_the_digest_cache_is_keyed_by_stat_not_trusted_blindly(tmp_path):
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"one")
    cache = DigestCache(tmp_path / "d.json")
    first = cache.digest(str(lib))
    cache.save()
    lib.write_bytes(b"two")  # same size, new mtime and ctime: hashed again
    assert DigestCache(tmp_path / "d.json").digest(str(lib)) != first


def test_a_process_maps_its_interpreter_and_libraries(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60  # a bound, not a timing: a loaded host may take seconds to exec
        while True:  # until its own maps show the interpreter (it has exec-ed)
            found = mapped_files(child.pid)
            if any("python" in p for p in found) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert any(Path(p).name.startswith("libc") for p in found) or any("python" in p for p in found)
        assert all(os.path.isfile(p) for p in found)
    finally:
        child.communicate(b"")


def test_a_carried_file_outside_the_temporary_folder_is_refused(tmp_path):
    (tmp_path / CARRIED_DIR).mkdir()
    with pytest.raises(BundleError, match="outside the temporary folders"):
        put_back(tmp_path, (FileRecord("/usr/lib/evil.so", 1, "0" * 64, 0o755),), DigestCache(tmp_path / "d.json"))


def test_a_carried_file_is_put_back_at_its_path(tmp_path):
    content = b"\x7fELF package"
    digest = hashlib.sha256(content).hexdigest()
    (tmp_path / CARRIED_DIR).mkdir()
    (tmp_path / CARRIED_DIR / digest).write_bytes(content)
    base = Path(tempfile.mkdtemp(prefix="prebake-test-carried-"))  # the system's: a carried file's place
    target = base / "x" / "model.so"
    try:
        record = FileRecord(str(target), len(content), digest, 0o644)
        put_back(tmp_path, (record,), DigestCache(tmp_path / "d.json"))
        assert target.read_bytes() == content
        assert stat.S_IMODE(target.stat().st_mode) == 0o644  # as recorded: CRIU refuses another mode
        target.write_bytes(b"\x7fELF pockage")  # same size, other bytes: written again from the image
        put_back(tmp_path, (record,), DigestCache(tmp_path / "d.json"))
        assert target.read_bytes() == content
        target.chmod(0o755)  # the same bytes, another mode: written again with the recorded one
        put_back(tmp_path, (record,), DigestCache(tmp_path / "d.json"))
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
    finally:
        shutil.rmtree(base)


def test_no_criu_is_said_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv(host.CRIU_ENV, str(tmp_path / "criu"))
    answer = host.can_snapshot()
    assert isinstance(answer, host.Unable)
    assert "no CRIU" in answer.reason and ".ci/criu.sh" in answer.reason


def test_an_old_criu_is_refused_naming_its_version(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # its version is remembered there
    old = tmp_path / "criu"
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(0o755)
    monkeypatch.setenv(host.CRIU_ENV, str(old))
    answer = host.can_snapshot()
    assert isinstance(answer, host.Unable) and "CRIU 3.17.1" in answer.reason and "4.0 or newer" in answer.reason


def test_doctor_says_why_this_host_cannot_restore(tmp_path):
    env = {**os.environ, host.CRIU_ENV: str(tmp_path / "criu"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "prebake.engine.cli", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "snapshots: no: no CRIU" in done.stdout and ".ci/criu.sh" in done.stdout


def test_a_passing_criu_check_is_remembered_and_a_failing_one_is_not(tmp_path, monkeypatch):
    criu = tmp_path / "criu"
    criu.write_text("#!/bin/sh\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    answers = ["Error: no", None, None]
    ran = []

    def check(binary: str, kernel: str) -> str | None:
        ran.append(binary)
        return answers[len(ran) - 1]

    monkeypatch.setattr(host, "_criu_check", check)
    assert host._checked(criu, "6.18") == "Error: no"  # a failure: run again next time
    assert host._checked(criu, "6.18") is None
    assert host._checked(criu, "6.18") is None  # remembered: not run a third time
    assert len(ran) == 2
    assert host._checked(criu, "6.19") is None  # another kernel: checked again
    assert len(ran) == 3


def test_a_gguf_recipes_weights_are_its_dequantized_folder_recorded_never_carried(tmp_path, monkeypatch):
    """SmolLM2's GGUF is served from its folder dequantized to the target's dtype: those files are
    checked at a restore like any weights, and stay out of the bundle even under a temporary folder."""
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.bundled.runtime.gguf_folder import gguf_folder_path
    from prebake.engine.bundled.runtime.loader import torch_dtype
    from prebake.engine.bundled.snapshot.image import carried_path
    from prebake.engine.bundled.snapshot.kind import weights_files

    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path))
    recipe = load_recipe("smollm2-135m")
    folder = gguf_folder_path(recipe.model, torch_dtype("bf16"), tmp_path)
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes(b"{}")
    found = weights_files(recipe, "bf16")
    assert found == [str(folder / "config.json"), str(folder / "model.safetensors")]
    assert not carried_path(found[1], (str(folder),))
    assert weights_files(recipe, "fp32") == []  # another dtype's folder, not written here


def test_criu_s_version_is_remembered_per_binary_and_asked_again_when_it_changes(tmp_path, monkeypatch):
    criu, ran = tmp_path / "criu", tmp_path / "ran"
    criu.write_text(f"#!/bin/sh\necho x >> {ran}\necho 'Version: 4.1.1'\n")
    criu.chmod(0o755)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for _ in range(2):  # a start each: the in-process cache forgotten between them
        host.criu_version.cache_clear()
        assert host.criu_version(criu) == "4.1.1"
    assert ran.read_text().count("x") == 1  # the second start read it from the cache
    criu.write_text(f"#!/bin/sh\necho x >> {ran}\necho 'Version: 4.2'\n")  # another binary at the same path
    host.criu_version.cache_clear()
    assert host.criu_version(criu) == "4.2"
    assert ran.read_text().count("x") == 2
    host.criu_version.cache_clear()


def _mounts(tmp_path, *lines: str):
    table = tmp_path / "mounts"
    table.write_text("".join(f"{line}\n" for line in lines))
    return table


def test_the_mount_holding_a_path_is_the_last_of_its_longest_mount_point(tmp_path):
    table = _mounts(
        tmp_path,
        "/dev/vda / ext4 rw 0 0",
        "tmpfs /run tmpfs rw 0 0",
        "overlay /run overlay rw 0 0",  # mounted over it later: this one is seen
        "tmpfs /my\\040dir tmpfs rw 0 0",  # a space, as the kernel escapes it
    )
    assert host.mounted_type(Path("/run/lock"), table) == "overlay"
    assert host.mounted_type(Path("/runner"), table) == "ext4"  # not under /run
    assert host.mounted_type(Path("/my dir/x"), table) == "tmpfs"
    assert host.mounted_type(Path("/run"), tmp_path / "absent") is None


def test_criu_s_kernel_feature_cache_is_said_kept_or_not(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setattr(host, "KDAT_DIR", run)
    on_disk = _mounts(tmp_path, f"/dev/vda {run} ext4 rw 0 0")
    note = host.kdat_note(on_disk)
    assert note is not None and "ext4, not a tmpfs" in note and "a tmpfs at" in note
    tmpfs = _mounts(tmp_path, f"tmpfs {run} tmpfs rw 0 0")
    assert host.kdat_note(tmpfs) is None
    (run / "criu.kdat.tmp").write_bytes(b"")  # a CRIU stopped while writing it: no later CRIU writes the cache
    note = host.kdat_note(tmpfs)
    assert note is not None and "criu.kdat.tmp" in note and "remove it" in note
    assert host.kdat_note(tmp_path / "no-mount-table") is None  # nothing known: nothing said
    (run / "criu.kdat").write_bytes(b"k")  # the cache is there: CRIU reads it
    assert host.kdat_note(on_disk) is None


def test_the_check_cache_keeps_the_newest_binaries_versions_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for n in range(host.REMEMBERED + 3):
        host._remember(version=(f"criu-{n}", f"4.{n}"))
    host._remember(passed="stamp")
    kept = host._read_check_cache()
    assert list(kept["versions"]) == [f"criu-{n}" for n in range(3, host.REMEMBERED + 3)]
    assert kept["stamp"] == "passed"  # the form older prebakes read and write: {stamp: "passed"}
    host._remember(version=("criu-3", "4.3"))  # written again: now the newest
    kept = host._read_check_cache()
    assert list(kept["versions"])[-1] == "criu-3" and kept["stamp"] == "passed"
    host._remember(passed="another")  # one stamp is kept
    assert "stamp" not in host._read_check_cache() and host._read_check_cache()["another"] == "passed"
