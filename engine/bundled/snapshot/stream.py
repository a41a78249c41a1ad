"""A restore into an empty store, streamed: the snapshot's bundle goes from the registry into CRIU
without landing in the store first; the store's entry is installed once the server is ready.

    download   fetch_blob into a scratch file, its sha256 checked as it comes, every chunk fed to
    extract    zstd, then tar: each member held to the signed manifest (CheckedMembers); the small
               ones kept in memory, each sha256 checked before anything reads it
    serve      CRIU's image streamer protocol (stream_wire.py) answered from those members
    pages      streamed/pages-N.img into CRIU's pipe as decompressed, its last chunk held back
               until the blob's sha256 (which fixes every byte of it) matched: CRIU cannot finish
    commit     after ready: the usual install from the verified scratch blob, at idle priority,
               every member's sha256 checked (a file list that disagrees with its blob: no entry)
Why and what it costs: docs/snapshots.md, "Into an empty store".
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from prebake.artifacts.bundle.download_pipe import Aborted, Feed
from prebake.artifacts.bundle.manifest import FileEntry, Manifest
from prebake.artifacts.bundle.tarheader import BLOCK
from prebake.artifacts.bundle.unpack import CheckedMembers, UnpackLimits, read_checked
from prebake.artifacts.bundle.unpack_write import check_member
from prebake.artifacts.errors import StoreError
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.store.local import Store
from prebake.engine.bundled.snapshot import quiet
from prebake.engine.bundled.snapshot import stream_wire as wire
from prebake.engine.bundled.snapshot.image import IMAGES_DIR, STREAMED_DIR


class Streamer:
    """One snapshot bundle streamed from `registry` into a CRIU restore; `start`, then `in_hand` (the
    small members, verified), then CRIU with `--stream -D images`; `wait_verified` says whether every
    byte matched; `close` stops what still runs."""

    def __init__(self, manifest: Manifest, registry: Registry, scratch: Path, limits: UnpackLimits, deadline: float):
        self.manifest, self.registry, self.scratch, self.limits = manifest, registry, scratch, limits
        self.deadline = deadline  # time.monotonic(): the download stops at its next chunk after it (--fetch-timeout)
        self.images = _short(scratch / IMAGES_DIR)  # only CRIU's socket is in it
        self.blob = scratch / "blob"
        self.what = f"blob {manifest.blob.digest[:23]} ({manifest.kind} {manifest.key_digest[:16]})"
        self.small: dict[str, bytes] = {}
        self.streamed = {f.path for f in manifest.files if f.path.startswith(STREAMED_DIR + "/") and f.link is None}
        self.links: dict[str, str] = {}
        self._cond = threading.Condition()
        self._in_hand = self._blob_verified = self._members_verified = self._criu_gone = False
        self._error: BaseException | None = None
        self._pipes: dict[str, int] = {}  # a streamed member's CRIU pipe (write end), once asked for
        self._held: list[tuple[int, bytes]] = []  # last chunks, written once everything matched
        self.lanes: list[wire.Lane] = []  # kept with the streamer: CRIU may read their buffers till it ends
        self._feed = Feed()
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # bound by start, closed by close
        self.times: dict[str, float] = {}  # time.monotonic() of: start, in_hand, pages (the first asked for), streamed

    # -- the caller's side --------------------------------------------------------------------

    def start(self) -> None:
        self.times["start"] = time.monotonic()
        self.images.mkdir(parents=True, exist_ok=True)
        self._listener.bind(str(self.images / wire.SOCKET))
        self._listener.listen(1)
        for name, target in (("download", self._download), ("extract", self._extract), ("serve", self._serve)):
            thread = threading.Thread(target=target, name=f"prebake-stream-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def in_hand(self) -> dict[str, bytes] | str:
        """Every member before streamed/, verified (path -> bytes), or why not."""
        with self._cond:
            self._cond.wait_for(lambda: self._in_hand or self._error is not None)
            if self._error is not None:
                return refusal(self, self._error)
            return self.small

    def settle(self) -> BaseException | None:
        """After CRIU failed: the stream run out (nothing more is written), and why the bundle was
        refused, if it was (a refused bundle is what made CRIU fail: its pipe closed short)."""
        with self._cond:
            self._criu_gone = True
            self._cond.notify_all()
        for thread in self._threads[:2]:  # the download and the extraction
            thread.join(max(0.0, self.deadline - time.monotonic()))
        return self._error

    def wait_verified(self) -> BaseException | None:
        """Once the stream ended: None if the blob matched its digest and every member its
        manifest entry (the small ones by sha256 too), else why not."""
        with self._cond:
            self._cond.wait_for(lambda: (self._blob_verified and self._members_verified) or self._error is not None)
            return self._error

    def close(self) -> None:
        """Stop every thread (CRIU's pipes closed: a restore still reading fails) and the socket."""
        self._fail(StoreError(f"{self.what}: the streamed restore was stopped"))
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes an accept() still waiting for CRIU
        except OSError:
            pass
        self._listener.close()
        for thread in self._threads:
            thread.join(5)
        self._drop_socket_folder()

    def _drop_socket_folder(self) -> None:
        """A private folder for CRIU's socket (_short) goes once CRIU connected (it connects once),
        so a supervisor killed after that leaves nothing under the system's temporary folder."""
        if not self.images.is_relative_to(self.scratch):
            shutil.rmtree(self.images, ignore_errors=True)

    # -- the threads --------------------------------------------------------------------------

    def _download(self) -> None:
        blob = self.manifest.blob
        try:
            self.registry.fetch_blob(blob.digest, self.blob, size=blob.size, tee=self._until_deadline)
        except BaseException as exc:
            self._feed.abort()
            self._fail(exc)
            return
        self._feed.close()
        with self._cond:
            self._blob_verified = True
            self._cond.notify_all()
        self._release_held()

    def _until_deadline(self, chunk: bytes) -> None:
        if time.monotonic() > self.deadline:
            raise StoreError(f"{self.what}: still downloading when the fetch's time box ran out (--fetch-timeout)")
        self._feed.put(chunk)

    def _extract(self) -> None:
        try:
            read_checked(
                cast(io.BufferedReader, self._feed),
                lambda reader: _Members(reader, self),
                self.manifest.files,
                self.limits,
                self.what,
            )
        except Aborted:
            self._feed.finished(None)
            return
        except BaseException as exc:
            self._feed.finished(exc)
            self._close_pipes()  # CRIU stops at once
            self._threads[0].join()  # the download's verdict first: a wrong blob is the cause (unpack_streamed's rule)
            self._fail(exc)
            return
        self._feed.finished(None)  # what is left of the blob is only hashed
        with self._cond:
            self._members_verified = True
            self._cond.notify_all()
        self._release_held()

    def _serve(self) -> None:
        """CRIU's requests, one connection: a length-prefixed img_streamer_request_entry (its file
        name); the reply whether it exists; if it does, a pipe's write end (SCM_RIGHTS) for its bytes."""
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return  # closed before CRIU came
        self._drop_socket_folder()
        with conn:
            while (name := wire.request(conn)) is not None:
                member = self._resolve(f"{IMAGES_DIR}/{name}")
                streamed = member in self.streamed
                exists = streamed or member in self.small
                conn.sendall(wire.reply(exists))
                if not exists:
                    continue
                fd = wire.receive_pipe(conn)
                if streamed:
                    with self._cond:
                        refused = self._error is not None  # its pipes were closed already: CRIU gets EOF now
                        if not refused:
                            self._pipes[member] = fd
                        self._cond.notify_all()
                    if refused:
                        wire.close(fd)
                else:
                    threading.Thread(target=wire.write_all, args=(fd, self.small[member]), daemon=True).start()

    # -- shared state -------------------------------------------------------------------------

    def _resolve(self, member: str) -> str:
        """`member` through the tree's links (images/pages-N.img -> streamed/pages-N.img)."""
        for _ in range(8):
            target = self.links.get(member)
            if target is None:
                return member
            member = posixpath.normpath(posixpath.join(posixpath.dirname(member), target))
        return member

    def _pipe(self, member: str) -> int:
        """CRIU's pipe for a streamed member, once CRIU asked for it."""
        self._mark_in_hand()
        with self._cond:
            self._cond.wait_for(lambda: member in self._pipes or self._error is not None or self._criu_gone)
            if member not in self._pipes:
                raise Aborted()
            self.times.setdefault("pages", time.monotonic())
            return self._pipes[member]

    def _mark_in_hand(self) -> None:
        with self._cond:
            self.times.setdefault("in_hand", time.monotonic())
            self._in_hand = True
            self._cond.notify_all()

    def _hold(self, fd: int, last: bytes) -> None:
        with self._cond:
            self._held.append((fd, last))

    def _release_held(self) -> None:
        """The held last chunks into their pipes, once the blob and every member matched."""
        with self._cond:
            if not (self._blob_verified and self._members_verified) or self._error is not None:
                return
            held, self._held = self._held, []
        for fd, last in held:
            wire.write_all(fd, last)
        self.times["streamed"] = time.monotonic()

    def timings(self) -> str:
        """Where the stream's time went, for the start's log."""
        t = self.times
        if not {"start", "in_hand", "pages", "streamed"} <= t.keys():
            return "not streamed whole"
        size = sum(f.size for f in self.manifest.files if f.path.startswith(STREAMED_DIR + "/"))
        return (
            f"{self.manifest.blob.size / 1e6:.1f} MB fetched and verified, its small files in hand "
            f"{t['in_hand'] - t['start']:.3f} s after the start; {size / 1e6:.1f} MB of pages streamed into "
            f"CRIU in {t['streamed'] - t['pages']:.3f} s ({t['pages'] - t['start']:.3f} s after the start it asked)"
        )

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()
        self._feed.abort()
        self._close_pipes()

    def _close_pipes(self) -> None:
        with self._cond:
            held, self._held = self._held, []
            pipes, self._pipes = dict(self._pipes), {}
        for fd in [fd for fd, _ in held] + list(pipes.values()):
            wire.close(fd)


class _Members(CheckedMembers):
    """The bundle's members, each held to the manifest: small ones kept (their sha256 checked), the
    streamed ones (their name, type and size checked) written into CRIU's pipe as they come, their
    last chunk held back until the blob's digest matched.

    The pages' own sha256 is not computed on this path: the blob's digest, which the signed manifest
    names and the download checks before the last chunk goes, already fixes every byte CRIU reads;
    hashing 200 MB again cost tiny-llama's restore about 0.1 s on two cores (docs/snapshots.md). What
    the member digest adds, refusing a signed file list that disagrees with its own blob, the
    commit's install still does: such a bundle serves the blob's bytes and is never installed."""

    def __init__(self, reader: io.BufferedReader, streamer: Streamer):
        super().__init__(reader, streamer.manifest.files, streamer.what)
        self.streamer = streamer

    def _link(self, name: str, folder: str, target: str) -> None:
        self.streamer.links[name] = target

    def _finish(self) -> None:
        self.streamer._mark_in_hand()

    def _write(self, name: str, folder: str, entry: FileEntry) -> None:
        if name in self.streamer.streamed:
            self._stream(name, entry)
            return
        data = bytearray(entry.size)
        self._fill(memoryview(data), entry.size, entry)
        self._skip(-entry.size % BLOCK)
        check_member(entry, hashlib.sha256(data), self.what)
        self.streamer.small[name] = bytes(data)

    def _stream(self, name: str, entry: FileEntry) -> None:
        """The member into CRIU's pipe as it is decompressed: this thread decompresses, a lane
        writes (at once, on two cores). Both start before CRIU asks for it (CRIU starts once the
        small members are in hand, and asks a few hundredths of a second later): up to
        LANE_BUFFERS chunks are ready by then."""
        self.streamer._mark_in_hand()
        lane = wire.Lane(lambda: self.streamer._pipe(name))
        self.streamer.lanes.append(lane)  # its buffers may be in CRIU's pipe until CRIU is done
        remaining = entry.size
        try:
            while remaining:
                buffer = lane.free()
                n = self._fill(buffer[: min(wire.CHUNK, remaining)], remaining, entry)
                remaining -= n
                lane.put(buffer, n, last=not remaining)
        finally:
            last = lane.finish()
        if lane.fd is None:
            raise Aborted()  # CRIU failed before it asked for the pages: nothing to hand them to
        self._skip(-entry.size % BLOCK)
        self.streamer._hold(lane.fd, last)


def commit(
    store: Store,
    manifest: Manifest,
    registry: Registry,
    streamer: Streamer,
    server: int | None = None,
    stopped: threading.Event | None = None,
) -> None:
    """The store's entry for the streamed bundle: the usual install, its blob copied (and verified
    again) from the scratch file, on an idle-priority thread, once the restored server (the process
    tree under `server`) is quiet or has `stopped`: the restored server comes first. Another start
    installing the same blob is waited for until `stopped`, then InstallElsewhereError (it finishes
    the entry; the stopped start's exit does not wait on its idle-priority install)."""
    quiet.idle_priority()
    if stopped is not None and stopped.is_set():  # the server ended before this thread ran: hurry() came first
        quiet.hurry()
    if server is not None:
        quiet.wait_for_quiet(server, stopped or threading.Event())
    kept = cast(Registry, _Kept(registry, streamer.blob))
    store.install(manifest, kept, until=stopped)


class _Kept:
    """`registry`, whose blob is the scratch file the stream downloaded (only fetch_blob is asked)."""

    def __init__(self, registry: Registry, blob: Path):
        self.registry, self.blob, self.url = registry, blob, registry.url

    def fetch_blob(
        self, digest: str, dest: Path, *, size: int | None = None, tee: Callable[[bytes], None] | None = None
    ) -> Path:
        from prebake.registry.shared.transfer import copy_verified

        where = f"{self.blob} (streamed from {self.url})"
        return copy_verified(self.blob, dest, digest, where=where, registry_url=self.url, size=size, tee=tee)

    def __getattr__(self, name: str) -> object:
        return getattr(self.registry, name)


def remove(streamer: Streamer) -> None:
    shutil.rmtree(streamer.scratch, ignore_errors=True)


def _short(images: Path) -> Path:
    """`images`, or a private folder under the system's temporary one when the socket's path in it
    would not fit a UNIX socket address (108 bytes; CRIU cuts a longer one short and misses it)."""
    if len(os.fsencode(images / wire.SOCKET)) < wire.SUN_PATH:
        return images
    return Path(tempfile.mkdtemp(prefix="prebake-criu-stream-"))


def refusal(streamer: Streamer, exc: BaseException) -> str:
    """Why a streamed bundle was refused, as the fetch pipeline says it of an install."""
    return f"fetching {streamer.what} failed: {type(exc).__name__}: {exc}"
