"""A snapshot streamed from the registry into a restore (engine/bundled/snapshot/stream.py), without
CRIU: this test speaks CRIU's side of the image streamer protocol (criu/img-streamer.c) to a real
Streamer over a real file registry and store. Every image is served only once it matched the
manifest; the pages' last chunk only once the pages and the blob matched (a bundle that does not
match never lets a restore finish); the store's entry, installed after, is whole or absent."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from prebake.artifacts.bundle.manifest import FileEntry, Manifest
from prebake.artifacts.bundle.payload import pack
from prebake.artifacts.bundle.unpack import UnpackLimits, tree_problems
from prebake.artifacts.errors import BundleError, InstallElsewhereError
from prebake.artifacts.keys import Key
from prebake.artifacts.store.local import Store
from prebake.engine.bundled.snapshot import quiet, serving, stream
from prebake.engine.bundled.snapshot.image import IMAGES_DIR, STREAMED_DIR, move_streamed
from prebake.engine.bundled.snapshot.stream_wire import SOCKET
from prebake.registry.backends.file import FileRegistry

PAGES = bytes(range(256)) * (3 * 4096 + 7)  # three chunks and a little: the last one is held back
CORE = b"core image " * 100


def _published(tmp_path: Path, tamper_pages_digest: bool = False) -> tuple[FileRegistry, Manifest]:
    tree = tmp_path / "tree"
    (tree / IMAGES_DIR).mkdir(parents=True)
    (tree / "snapshot.json").write_text("{}")
    (tree / IMAGES_DIR / "core-1.img").write_bytes(CORE)
    (tree / IMAGES_DIR / "pages-1.img").write_bytes(PAGES)
    move_streamed(tree)  # as the bake leaves it: images/pages-1.img -> ../streamed/pages-1.img
    packed = pack(tree, tmp_path / "blob.tar.zst")
    files = packed.files
    if tamper_pages_digest:  # a signed manifest that disagrees with its own blob's member
        files = tuple(
            FileEntry(path=f.path, size=f.size, sha256="sha256:" + "0" * 64) if f.path.startswith(STREAMED_DIR) else f
            for f in files
        )
    key = Key.of("snapshot", {"software": {"torch": "2.13.0+cpu"}})
    manifest = Manifest(
        kind=key.kind,
        key=key.to_json()["groups"],
        key_digest=key.digest,
        blob=packed.blob,
        files=files,
        created="2026-12-05T00:00:00+00:00",
        builder="test",
    )
    registry = FileRegistry(tmp_path / "registry")
    registry.publish(manifest, tmp_path / "blob.tar.zst")
    return registry, manifest


def _streamer(tmp_path: Path, registry: FileRegistry, manifest: Manifest, scratch: str = "scratch") -> stream.Streamer:
    streamer = stream.Streamer(manifest, registry, tmp_path / scratch, UnpackLimits(), time.monotonic() + 60)
    streamer.start()
    return streamer


def _commit(store: Store, manifest: Manifest, registry: FileRegistry, streamer: stream.Streamer, stopped=None) -> None:
    """stream.commit on a thread of its own, as serving runs it (it sets its thread's priority);
    by default once the server ended: at the usual priority (at idle, a busy host starves it)."""
    if stopped is None:
        stopped = threading.Event()
        stopped.set()
    with ThreadPoolExecutor(1) as pool:
        pool.submit(stream.commit, store, manifest, registry, streamer, None, stopped).result()


class _Criu:
    """CRIU's side: a request (its length, then img_streamer_request_entry), the reply, then a pipe's
    write end sent over the socket for a file that exists; the file read from the pipe's other end."""

    def __init__(self, images: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(images / SOCKET))

    def open(self, name: str) -> int | None:
        body = bytes([0x0A, len(name)]) + name.encode()
        self.sock.sendall(struct.pack("<I", len(body)) + body)
        size = struct.unpack("<I", self._exactly(4))[0]
        reply = self._exactly(size)
        if reply != bytes([0x08, 1]):
            return None
        read, write = os.pipe()
        socket.send_fds(self.sock, [b"\0"], [write])
        os.close(write)
        return read

    def read(self, name: str) -> bytes:
        fd = self.open(name)
        assert fd is not None, name
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def close(self) -> None:
        self.sock.close()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            data += self.sock.recv(n - len(data))
        return data


def test_criu_gets_each_image_verified_and_the_store_its_whole_entry_after(tmp_path):
    registry, manifest = _published(tmp_path)
    streamer = _streamer(tmp_path, registry, manifest)
    small = streamer.in_hand()
    assert isinstance(small, dict) and small["snapshot.json"] == b"{}"  # the description, before CRIU runs
    criu = _Criu(streamer.images)
    assert criu.read("core-1.img") == CORE
    assert criu.open("timens-0.img") is None  # an image the dump did not write: "no such file"
    assert criu.read("pages-1.img") == PAGES  # through the link, streamed
    criu.close()
    assert streamer.wait_verified() is None
    store = Store(tmp_path / "home")
    _commit(store, manifest, registry, streamer)
    installed = store.lookup("snapshot", manifest.key_digest)
    assert installed is not None and tree_problems(installed.tree, manifest.files) == []
    streamer.close()
    stream.remove(streamer)
    assert not streamer.scratch.exists()


def _verified(tmp_path: Path, tamper_pages_digest: bool = False) -> tuple[FileRegistry, Manifest, stream.Streamer]:
    """A bundle streamed whole: CRIU read its pages, and the stream matched the blob."""
    registry, manifest = _published(tmp_path, tamper_pages_digest)
    streamer = _streamer(tmp_path, registry, manifest)
    assert isinstance(streamer.in_hand(), dict)
    criu = _Criu(streamer.images)
    assert criu.read("pages-1.img") == PAGES
    criu.close()
    assert streamer.wait_verified() is None
    return registry, manifest, streamer


def test_pages_are_held_to_the_blob_and_a_file_list_unlike_its_blob_is_never_installed(tmp_path):
    """The pages' bytes are fixed by the blob's digest (checked before their last chunk goes), not
    hashed again on the restore's path: a signed manifest whose pages' sha256 disagrees with its own
    blob serves the blob's bytes, and the commit's install, which checks every member, refuses it:
    no entry in the store, the refusal naming the member."""
    registry, manifest, streamer = _verified(tmp_path, tamper_pages_digest=True)
    store = Store(tmp_path / "home")
    with pytest.raises(BundleError, match="pages-1.img"):
        _commit(store, manifest, registry, streamer)
    assert store.lookup("snapshot", manifest.key_digest) is None
    streamer.close()


def _corrupt(tmp_path: Path) -> tuple[FileRegistry, Manifest]:
    registry, manifest = _published(tmp_path)
    (blob,) = (tmp_path / "registry").rglob("*.tar.zst")
    data = bytearray(blob.read_bytes())
    data[-40] ^= 0xFF  # near the end: in the pages, after the small images
    blob.write_bytes(bytes(data))
    return registry, manifest


def test_a_blob_unlike_its_digest_is_refused_as_the_fetch_refuses_it(tmp_path):
    registry, manifest = _corrupt(tmp_path)
    streamer = _streamer(tmp_path, registry, manifest)
    small = streamer.in_hand()
    if isinstance(small, dict):  # the small images came through whole: the pages are cut short
        criu = _Criu(streamer.images)
        assert len(criu.read("pages-1.img")) < len(PAGES)
        criu.close()
    why = stream.refusal(streamer, streamer.settle() or AssertionError("not refused"))
    assert "it is corrupt" in why and "fetching blob" in why
    streamer.close()


def test_criu_asking_for_the_pages_after_the_bundle_was_refused_reads_their_end_at_once(tmp_path):
    """The pipe CRIU hands over after the refusal closed every pipe is closed too: once it was kept
    open, and CRIU waited for pages that never came until the restore's time box (120 s) ran out."""
    for attempt in range(20):  # the refusal may come before the small images are in hand: CRIU never starts
        registry, manifest = _corrupt(tmp_path / str(attempt))
        streamer = _streamer(tmp_path / str(attempt), registry, manifest)
        if isinstance(streamer.in_hand(), dict):
            break
        streamer.close()
    criu = _Criu(streamer.images)
    assert streamer.settle() is not None  # refused, every pipe closed, before CRIU asks for the pages
    reader = threading.Thread(target=lambda: criu.read("pages-1.img"), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "CRIU's pipe for the pages was left open after the refusal"
    criu.close()
    streamer.close()


_COMMIT_KILLED = """
import sys, threading, time
from pathlib import Path
from prebake.artifacts.bundle.unpack import UnpackLimits
from prebake.artifacts.store.local import Store
from prebake.engine.bundled.snapshot import quiet, stream
from tests.unit.test_snapshot_stream import _Criu, _published
tmp = Path(sys.argv[1])
registry, manifest = _published(tmp)
streamer = stream.Streamer(manifest, registry, tmp / "home" / "tmp" / "stream", UnpackLimits(), time.monotonic() + 60)
streamer.start()
streamer.in_hand()
criu = _Criu(streamer.images)
criu.read("core-1.img"), criu.read("pages-1.img")
criu.close()
assert streamer.wait_verified() is None
stopped = threading.Event()
stopped.set()  # the server ended: the usual priority (at idle, a busy host starves it)
stream.commit(Store(tmp / "home"), manifest, registry, streamer, None, stopped)  # killed before its tree is renamed in
"""


def test_a_commit_killed_half_way_leaves_no_entry_and_the_next_start_installs_it_whole(tmp_path):
    env = {**os.environ, "PREBAKE_TEST_CRASH_AT": "unpack", "PYTHONPATH": str(Path(__file__).parents[2])}
    killed = subprocess.run([sys.executable, "-c", _COMMIT_KILLED, str(tmp_path)], env=env, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    store = Store(tmp_path / "home")
    registry = FileRegistry(tmp_path / "registry")
    (manifest,) = registry.list("snapshot")
    assert store.lookup("snapshot", manifest.key_digest) is None  # no half entry: no index, no tree
    assert not store.tree_path(manifest).exists()
    installed = store.install(manifest, registry)  # the usual install after it: the partial goes
    assert tree_problems(installed.tree, manifest.files) == []
    assert not [p for p in installed.tree.parent.iterdir() if p.name.endswith(".partial")]


def test_a_scratch_folder_too_deep_for_a_socket_address_serves_from_a_short_one(tmp_path):
    """A UNIX socket's path fits 108 bytes (a store under a long $PREBAKE_HOME does not): CRIU gets a
    private folder of the system's, removed once CRIU connected (a supervisor killed after that
    leaves nothing there) and with the streamer."""
    registry, manifest = _published(tmp_path)
    streamer = _streamer(tmp_path, registry, manifest, scratch="s" * 120)
    assert not streamer.images.is_relative_to(streamer.scratch)
    assert isinstance(streamer.in_hand(), dict)
    criu = _Criu(streamer.images)
    assert criu.read("pages-1.img") == PAGES
    assert not streamer.images.exists()  # gone as CRIU connected: its requests were answered after
    criu.close()
    assert streamer.wait_verified() is None
    streamer.close()
    assert not streamer.images.exists()


def test_a_stop_before_criu_ran_closes_the_stream_and_its_private_socket_folder(tmp_path, monkeypatch):
    """An operator's SIGTERM while the stream starts is a SystemExit out of the restore (Stopping):
    the streamer is closed on the way out, so no private socket folder is left under the system's
    temporary folder and no thread of it runs on."""
    registry, manifest = _published(tmp_path)
    made: list[stream.Streamer] = []

    def stopped_as_it_starts(streamer, *args):
        made.append(streamer)
        streamer.start()
        raise SystemExit(128 + signal.SIGTERM)

    monkeypatch.setattr(serving, "_restore_streamed", stopped_as_it_starts)
    store = Store(tmp_path / ("h" * 120))
    services = SimpleNamespace(store=store)
    with pytest.raises(SystemExit):
        serving._serve_streamed(manifest, registry, None, None, {}, services, 60.0, print, None)  # type: ignore[arg-type]
    (streamer,) = made
    assert not streamer.images.is_relative_to(streamer.scratch)  # a private folder was made, and is gone
    assert not streamer.images.exists()
    assert not [t for t in streamer._threads if t.is_alive()]
    assert streamer.scratch.exists()  # the scratch folder stays, as after any start that did not serve


@pytest.mark.parametrize("name", ["../snapshot.json", "/etc/passwd", "pages-1.img/../../carried"])
def test_criu_gets_no_file_outside_the_images(tmp_path, name):
    registry, manifest = _published(tmp_path)
    streamer = _streamer(tmp_path, registry, manifest)
    assert isinstance(streamer.in_hand(), dict)
    criu = _Criu(streamer.images)
    assert criu.open(name) is None
    criu.close()
    streamer.close()


def _spinner(flag: Path) -> subprocess.Popen:
    """A process whose child spins on a core until `flag` exists, then sleeps; in a session of its
    own, so that _stop takes the child too (a spinning orphan would eat a core of the suite's)."""
    child = f"import os, time\nwhile not os.path.exists({str(flag)!r}): pass\ntime.sleep(60)\n"
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}])\n"
    return subprocess.Popen([sys.executable, "-c", parent], start_new_session=True)


def _stop(server: subprocess.Popen) -> None:
    """The spinner and its child, by their process group (the spinner's pid: it leads its session)."""
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait()


class _Ticks:
    """A tree's CPU ticks as wait_for_quiet reads them: `busy` ticks a read while `spinning` is set,
    none after; None once `gone` is set (its root exited)."""

    def __init__(self, busy: int):
        self.busy, self.total = busy, 0
        self.spinning, self.gone = threading.Event(), threading.Event()
        self.spinning.set()

    def __call__(self, root: int) -> int | None:
        if self.gone.is_set():
            return None
        self.total += self.busy if self.spinning.is_set() else 0
        return self.total


def test_the_commit_waits_while_the_restored_servers_tree_is_busy_and_goes_once_it_is_quiet():
    """The decision, on scripted readings (how busy a real tree looks depends on the host's load:
    under CI's, a spinning process may get under a tenth of a core; the reading itself is tested
    on real processes below)."""
    ticks = _Ticks(busy=os.sysconf("SC_CLK_TCK"))  # a whole core each tick
    waited: list[float] = []
    waiter = threading.Thread(
        target=lambda: waited.append(quiet.wait_for_quiet(1, threading.Event(), 0.2, tick=0.01, cpu_ticks=ticks))
    )
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not waited  # busy: no entry yet
    ticks.spinning.clear()
    waiter.join(30)
    assert waited and 0.65 <= waited[0] < 30  # busy for the 0.5 s above, then quiet for 0.2 s
    quiet_after_gone = _Ticks(busy=100)
    quiet_after_gone.gone.set()
    assert quiet.wait_for_quiet(1, threading.Event(), cpu_ticks=quiet_after_gone) == 0.0
    ticks.spinning.set()  # steady traffic: the entry is still made after most_s
    assert 0.3 <= quiet.wait_for_quiet(1, threading.Event(), 10.0, most_s=0.3, tick=0.01, cpu_ticks=ticks) < 5


def test_a_trees_cpu_ticks_count_every_descendant(tmp_path):
    """tree_cpu_ticks reads the root and every descendant from /proc: the spinner's child, which
    spins, counts. No timing is assumed: it waits (up to a minute) until the child used some CPU."""
    server = _spinner(tmp_path / "never")
    try:
        deadline, spun = time.monotonic() + 60, None
        while spun is None and time.monotonic() < deadline:
            children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
            if children:
                fields = Path(f"/proc/{children[0]}/stat").read_text().rsplit(")", 1)[1].split()
                used = int(fields[11]) + int(fields[12])
                spun = used if used >= 50 else None  # half a second: far more than the root itself uses
            time.sleep(0.05)
        assert spun is not None, "the spinner's child never used 50 clock ticks of CPU in a minute"
        total = quiet.tree_cpu_ticks(server.pid)
        assert total is not None and total >= spun
    finally:
        _stop(server)
    assert quiet.tree_cpu_ticks(server.pid) is None  # gone


def test_the_commit_waits_for_no_tree_that_stopped_or_is_gone(tmp_path):
    server = _spinner(tmp_path / "never")
    try:
        stopped = threading.Event()
        stopped.set()
        assert quiet.wait_for_quiet(server.pid, stopped) < 1.0  # the server stopped: the entry is made now
    finally:
        _stop(server)
    assert quiet.wait_for_quiet(server.pid, threading.Event()) == 0.0  # gone


def test_a_stopped_start_leaves_the_entry_to_another_process_installing_it_and_takes_a_free_lock(tmp_path):
    """Two starts streamed into one store: the one stopped while the other holds the blob's install
    lock (at idle priority beside busy cores it may hold it for minutes) does not wait for it."""
    registry, manifest, streamer = _verified(tmp_path)
    store = Store(tmp_path / "home")
    lock = store.paths.install_lock(manifest.blob.hex)
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import fcntl, sys, time\nf = open({str(lock)!r}, 'a')\n"
         "fcntl.flock(f, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        stopped = threading.Event()
        threading.Timer(0.3, stopped.set).start()  # the server stops while the other process installs
        began = time.monotonic()
        with pytest.raises(InstallElsewhereError, match="another process is installing blob"):
            _commit(store, manifest, registry, streamer, stopped)
        assert 0.3 <= time.monotonic() - began < 10  # waited while it served, not after
        assert store.lookup("snapshot", manifest.key_digest) is None
    finally:
        _stop(holder)
    with ThreadPoolExecutor(1) as pool:  # stopped, the lock free: installed, at the usual priority
        policy = pool.submit(
            lambda: (stream.commit(store, manifest, registry, streamer, None, stopped), os.sched_getscheduler(0))[1]
        )
        assert policy.result() == os.SCHED_OTHER
    installed = store.lookup("snapshot", manifest.key_digest)
    assert installed is not None and tree_problems(installed.tree, manifest.files) == []
    streamer.close()


def test_once_the_server_ended_the_commits_threads_leave_idle_priority():
    """hurry(): the commit's thread and one it started (which inherited SCHED_IDLE) back to the usual
    policy, so the command's exit does not wait on threads a busy host starves."""
    ready, release, tids = threading.Barrier(3), threading.Event(), []

    def idle(start_child: bool) -> None:
        if start_child:
            quiet.idle_priority()
            threading.Thread(target=idle, args=(False,)).start()
        tids.append(threading.get_native_id())
        ready.wait()
        release.wait(60)

    threading.Thread(target=idle, args=(True,)).start()
    try:
        ready.wait(30)
        if any(os.sched_getscheduler(tid) != os.SCHED_IDLE for tid in tids):
            pytest.skip("this host refuses SCHED_IDLE: the commit falls back to nice 19 here")
        quiet.hurry()
        assert [os.sched_getscheduler(tid) for tid in tids] == [os.SCHED_OTHER] * 2
    finally:
        release.set()
