"""What the store reads of its volume: the filesystem under it (from /proc/self/mountinfo), whether it
is a network one whose locks may be local to each node, and the refusal a writer then gives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.scratch import Scratches
from prebake.artifacts.store.volume import filesystem, shared_kind, shared_refusal, writable
from tests.support import mounts

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /mnt/store rw,relatime shared:20 - nfs4 fileserver:/export/prebake rw,vers=4.2
41 40 0:36 / /mnt/store/local\\040cache rw - tmpfs tmpfs rw,size=1024k
"""


def test_the_deepest_mount_holding_the_home_names_its_filesystem():
    assert filesystem(Path("/mnt/store/home"), MOUNTINFO) == "nfs4"
    assert filesystem(Path("/mnt/store/local cache/home"), MOUNTINFO) == "tmpfs"
    assert filesystem(Path("/mnt/storehouse"), MOUNTINFO) == "ext4"  # a prefix of a name is not a mount


def test_network_filesystems_and_fuse_are_shared_the_rest_local():
    assert [shared_kind(t) for t in ("nfs", "nfs4", "cifs", "ceph", "fuse.sshfs", "fuseblk")] == ["network"] * 6
    assert [shared_kind(t) for t in ("ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs")] == ["local"] * 6


def test_a_writer_refuses_a_store_on_nfs_unless_the_operator_vouches_for_its_locks():
    refusal = shared_refusal(Path("/mnt/store/home"), {}, MOUNTINFO)
    assert refusal is not None and "nfs4" in refusal and "PREBAKE_SHARED_STORE=flock" in refusal
    assert shared_refusal(Path("/mnt/store/home"), {"PREBAKE_SHARED_STORE": "flock"}, MOUNTINFO) is None
    assert shared_refusal(Path("/home/x"), {}, MOUNTINFO) is None


def test_a_real_tmpfs_reads_as_local_and_writable_until_remounted_read_only(tmp_path):
    with mounts.tmpfs(tmp_path / "disk", 1 << 20) as disk:
        assert filesystem(disk / "store") == "tmpfs" and shared_refusal(disk / "store") is None
        assert writable(disk / "store")
        with mounts.read_only(disk):
            assert not writable(disk / "store")


_OWNER = """
import sys, time
from pathlib import Path
from prebake.artifacts.store.paths import StorePaths
from prebake.artifacts.store.scratch import Scratches
print(Scratches(StorePaths(Path(sys.argv[1]))).elsewhere("graphs", "nearly full"), flush=True)
time.sleep(600)
"""


def test_a_scratch_elsewhere_whose_owner_died_is_swept_by_the_next_and_a_live_ones_is_left(tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    owners = [
        subprocess.Popen(
            [sys.executable, "-c", _OWNER, str(tmp_path / "store")], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    dead, alive = (Path(p.stdout.readline().strip()) for p in owners)  # type: ignore[union-attr]
    try:
        (dead / "half-compiled.o").write_bytes(b"x" * 1000)
        owners[0].send_signal(signal.SIGKILL)
        owners[0].wait(30)
        other = temp / "someone-elses"  # not a prebake scratch: never touched
        other.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(temp))
        mine = Scratches(StorePaths(tmp_path / "store")).elsewhere("graphs", "nearly full")
        assert not dead.exists() and not (temp / (dead.name + ".owner.lock")).exists()
        assert alive.is_dir() and mine.is_dir() and other.is_dir()
    finally:
        owners[1].kill()
        owners[1].wait(30)
