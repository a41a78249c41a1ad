"""`prebake serve --snapshot auto|require` for the bundled engine: restore the target's snapshot, or
say in one line why not, for the usual start to run in the same call.

    able       this host can restore (host.py)                   else: not restored, why
    lookup     the target's recipe bakes a snapshot; its bundle is verified like any other: digest,
               signature, the trust policy (an image is code, as a pickle is)   else: the miss;
               one the store lacks is streamed from the registry into CRIU (stream.py) and
               installed once the server is ready
    files      every file it maps is this host's (files.py)       else: the first that differs
    restore    in a new PID namespace, the port and settings handed over (restore.py)  else: CRIU's error
    serve      supervised until SIGTERM/SIGINT; its exit status is the command's
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.manifest import Manifest
from prebake.artifacts.errors import ExitCode, InstallElsewhereError, PrebakeError
from prebake.artifacts.fetch.outcome import Miss, resolution
from prebake.artifacts.fetch.pipeline import record_resolution, verified_entries
from prebake.artifacts.fsutil import Flock
from prebake.artifacts.ports.registry import Registry
from prebake.artifacts.recipe.kinds import TargetKeys
from prebake.artifacts.store.local import Installed, Store
from prebake.engine.bundled.runtime import openmp
from prebake.engine.bundled.snapshot import quiet, stream
from prebake.engine.bundled.snapshot.files import DigestCache, FileRecord, first_difference
from prebake.engine.bundled.snapshot.host import Able, can_snapshot
from prebake.engine.bundled.snapshot.image import (
    CARRIED_DIR,
    IMAGES_DIR,
    INFO_FILE,
    SnapshotInfo,
    put_back,
    put_back_from,
)
from prebake.engine.bundled.snapshot.kind import NAME, digest_cache
from prebake.engine.bundled.snapshot.restore import Failed, Stopping, restore
from prebake.engine.common import starter
from prebake.engine.common.adapter import OpenServices, Services, StartRequest, plan_to_start

MODES = ("never", "auto", "require")
API_KEY_VARIABLE = "PREBAKE_API_KEY"  # prebake.engine.bundled.serve's: the HTTP server is not imported here
REJECT_UNKNOWN_FIELDS_VARIABLE = "PREBAKE_REJECT_UNKNOWN_FIELDS"  # the same
PREFIX = "prebake serve: snapshot:"
STREAM_VARIABLE = "PREBAKE_SNAPSHOT_STREAM"  # 0: a snapshot the store lacks is installed first, then restored


@dataclass(frozen=True)
class Served:
    code: int


@dataclass(frozen=True)
class NotRestored:
    reason: str


def snapshot_mode(text: str) -> str:
    """--snapshot's value, checked (argparse's type)."""
    if text not in MODES:
        import argparse

        raise argparse.ArgumentTypeError(f"--snapshot {text!r}: give one of {', '.join(MODES)}")
    return text


def serve_restored(
    request: StartRequest,
    handed_over: Mapping[str, object],
    open_services: OpenServices,
    emit: Callable[[str], None],
    stopping: Stopping,
) -> Served | NotRestored:
    """Serve from the snapshot until a signal, or why it could not be restored (nothing served).
    `handed_over`: what differs per start (host, port, API key, body limits, `began`: the epoch
    second this start began), read by the restored process right after the restore. A snapshot the
    store holds is restored from its tree; one only the registry holds is streamed from it into CRIU
    (stream.py) and installed once the server is ready."""
    able = can_snapshot()
    if not isinstance(able, Able):
        return NotRestored(able.reason)
    # What this process measured of its cores as it imported, for the restored process (whose own
    # probe would follow the restore): collected here, before any thread of the restore runs.
    settings = {**handed_over, "cores": openmp.handed_over(openmp.threads_wanted(os.environ))}
    services = open_services()
    with services.holds:
        plan = plan_to_start(request, services)
        if NAME not in plan.kinds:
            return NotRestored(f"{plan.target.name} has no {NAME} kind ([snapshot] bake = true in its recipe)")
        installed = _resolved(plan, request, services)
        if isinstance(installed, NotRestored):
            return installed
        if isinstance(installed, tuple):
            return _serve_streamed(*installed, plan, able, settings, services, request.fetch_timeout, emit, stopping)
        try:
            info = SnapshotInfo.read(installed.tree)
        except PrebakeError as exc:
            return NotRestored(str(exc))
        cache = DigestCache(digest_cache())
        put = lambda carried: put_back(installed.tree, carried, cache)  # noqa: E731
        if (differs := _ready_files(info, services, cache, put)) is not None:
            return differs
        work = services.store.scratch(f"restore-{os.getpid()}")  # CRIU's log: kept when the restore fails
        emit(f"{PREFIX} restoring {NAME} {installed.manifest.blob.hex[:12]} (CRIU {able.version})")
        outcome = restore(installed.tree / IMAGES_DIR, info, able, settings, work, _relayed, started=stopping.started)
        if isinstance(outcome, Failed):
            return NotRestored(outcome.reason)
        code = stopping.serve(outcome)
        shutil.rmtree(work, ignore_errors=True)
        return Served(code)


def _resolved(
    plan: TargetKeys, request: StartRequest, services: Services
) -> Installed | tuple[Manifest, Registry] | NotRestored:
    """The snapshot's tree in the store; or its verified registry entry, to stream (the store lacks
    it); or the miss. A mounted tree, or PREBAKE_SNAPSHOT_STREAM=0: the usual fetch, installed first."""
    if request.mounted or os.environ.get(STREAM_VARIABLE, "1") == "0":
        resolved = starter.fetch_bundles(plan, request, services, kinds=[NAME])
        installed = resolved.installed.get(NAME)
        return installed if installed is not None else NotRestored(_misses(resolved.misses))
    store = services.store
    looked, found = verified_entries(
        plan, [NAME], store=store, source=services.source, timeout=request.registry_timeout, hold=services.holds
    )
    value = found[NAME]
    if isinstance(value, Manifest) and looked.registry is not None:
        return value, looked.registry  # recorded once installed (_commit)
    if isinstance(value, Manifest):  # cannot be: a registry entry comes from an opened registry
        value = Miss(plan.key(NAME), "no registry to fetch it from")
    record_resolution(store, resolution(plan, looked.found, {NAME: value}, looked.store_refused))
    return value if isinstance(value, Installed) else NotRestored(_misses([value]))


def _serve_streamed(
    manifest: Manifest,
    registry: Registry,
    plan: TargetKeys,
    able: Able,
    handed_over: Mapping[str, object],
    services: Services,
    fetch_timeout: float,
    emit: Callable[[str], None],
    stopping: Stopping,
) -> Served | NotRestored:
    """Restore straight from the registry's blob (stream.py), then install it while the server runs.
    The streamer is closed however this ends, an operator's stop before CRIU ran included (its
    SystemExit): its threads stopped, CRIU's socket folder gone; the scratch folder (CRIU's log) is
    kept unless it served."""
    store = services.store
    scratch = store.scratch(f"stream-{os.getpid()}")  # CRIU's log too: kept when the restore fails
    streamer = stream.Streamer(manifest, registry, scratch, store.limits.unpack, time.monotonic() + fetch_timeout)
    try:
        served = _restore_streamed(streamer, plan, able, handed_over, services, emit, stopping)
    finally:
        streamer.close()
    if isinstance(served, Served):
        stream.remove(streamer)
    return served


def _restore_streamed(
    streamer: stream.Streamer,
    plan: TargetKeys,
    able: Able,
    handed_over: Mapping[str, object],
    services: Services,
    emit: Callable[[str], None],
    stopping: Stopping,
) -> Served | NotRestored:
    manifest, registry = streamer.manifest, streamer.registry
    try:
        streamer.start()
    except OSError as exc:  # its socket could not be made
        return NotRestored(f"the streamed restore could not start: {exc}")
    small = streamer.in_hand()
    if isinstance(small, str):
        return NotRestored(small)
    try:
        info = SnapshotInfo.parse(small[INFO_FILE].decode(), f"{streamer.what}: {INFO_FILE}")
    except (PrebakeError, KeyError, UnicodeDecodeError) as exc:
        return NotRestored(f"{streamer.what} holds no snapshot description this prebake reads ({exc})")
    cache = DigestCache(digest_cache())
    write = lambda r, temp: Path(temp).write_bytes(small[f"{CARRIED_DIR}/{r.sha256}"])  # noqa: E731
    put = lambda carried: put_back_from(write, carried, cache)  # noqa: E731
    if (differs := _ready_files(info, services, cache, put)) is not None:
        return differs
    emit(f"{PREFIX} restoring {NAME} {manifest.blob.hex[:12]} streamed from {registry.url} (CRIU {able.version})")
    outcome = restore(
        streamer.images, info, able, handed_over, streamer.scratch, _relayed, streamed=True, started=stopping.started
    )
    if isinstance(outcome, Failed):
        error = streamer.settle()  # a refused bundle is the cause: CRIU only saw its pipe close short
        return NotRestored(stream.refusal(streamer, error) if error is not None else outcome.reason)
    if (error := streamer.wait_verified()) is not None:  # cannot be: CRIU finished only on verified bytes
        outcome.stop()
        outcome.wait()
        return NotRestored(stream.refusal(streamer, error))
    emit(f"{PREFIX} {streamer.timings()}")
    stopped = threading.Event()
    committing = threading.Thread(
        target=_commit,
        args=(services.store, manifest, registry, streamer, plan, emit, outcome.proc.pid, stopped),
        name="prebake-snapshot-commit",
    )
    committing.start()
    code = stopping.serve(outcome)
    stopped.set()
    quiet.hurry()  # the server it yielded to has ended: the install no longer runs at idle priority
    committing.join()  # the store's entry whole before the command exits (a kill leaves only a partial)
    return Served(code)


def _commit(
    store: Store,
    manifest: Manifest,
    registry: Registry,
    streamer: stream.Streamer,
    plan: TargetKeys,
    emit: Callable[[str], None],
    server: int,
    stopped: threading.Event,
) -> None:
    try:
        stream.commit(store, manifest, registry, streamer, server, stopped)
    except InstallElsewhereError as exc:
        emit(f"{PREFIX} the streamed {NAME} was left to another start to install: {exc}")
        return
    except PrebakeError as exc:
        emit(f"{PREFIX} the streamed {NAME} was not installed into the store ({exc}); the next start fetches it")
        return
    installed = Installed(manifest, store.tree_path(manifest))
    record_resolution(store, resolution(plan, {NAME: manifest}, {NAME: installed}))
    emit(f"{PREFIX} {NAME} {manifest.blob.hex[:12]} installed into the store while serving")


def _ready_files(
    info: SnapshotInfo, services: Services, cache: DigestCache, put: Callable[[tuple[FileRecord, ...]], None]
) -> NotRestored | None:
    """Every mapped file this host's, the carried ones put back (`put`) under their run folders'
    shared locks; else why not."""
    if (differs := first_difference(info.files, cache)) is not None:
        return NotRestored(f"this host's files differ from the bake's: {differs.explain()}")
    _hold_run_folders(services.store, info.carried, services.holds)
    try:
        put(info.carried)
    except PrebakeError as exc:  # e.g. a run folder under another $PREBAKE_HOME than this host's
        return NotRestored(str(exc))
    cache.save()
    return None


def _misses(misses: Sequence[object]) -> str:
    explained = [m.explain() for m in misses if isinstance(m, Miss)]
    return " ".join(explained).replace("\n", ";") or "no snapshot bundle for this target"


def _hold_run_folders(store: Store, carried: tuple[FileRecord, ...], hold: ExitStack) -> None:
    """A shared lock on each run folder under the store's tmp/ that carried files go back into, held
    for as long as this command runs: no other process's sweep of tmp/ takes them away between their
    writing and CRIU's opening them; restores of one image share them."""
    tmp = os.path.realpath(store.paths.tmp)
    names = {
        Path(os.path.realpath(r.path)).relative_to(tmp).parts[0]
        for r in carried
        if os.path.realpath(r.path).startswith(tmp + os.sep)
    }
    for name in sorted(names):
        lock = Flock.acquire(store.paths.scratch_lock(name), shared=True)  # waits: never None
        assert lock is not None
        hold.enter_context(lock)


def serve_or_say(
    mode: str,
    request: StartRequest,
    handed_over: Mapping[str, object],
    open_services: OpenServices,
    emit: Callable[[str], None],
) -> int | None:
    """--snapshot `mode`: the exit status of a restored server, or None (one line said why) for the
    usual start; under `require` a snapshot that cannot be restored is exit 3 (a miss) instead."""
    if mode == "never" or not _recipe_bakes_one(request):
        return None  # the usual start, as before snapshots: nothing to say
    with Stopping() as stopping:
        outcome = serve_restored(request, handed_over, open_services, emit, stopping)
    if isinstance(outcome, Served):
        return outcome.code
    if stopping.signal is not None:  # the operator's stop came as it restored: no usual start after it
        emit(f"{PREFIX} not restored: {signal.Signals(stopping.signal).name} came as it restored; nothing served")
        return 128 + stopping.signal
    if mode == "require":
        emit(f"{PREFIX} not restored: {outcome.reason}; --snapshot require: not starting otherwise")
        return int(ExitCode.MISS)
    emit(f"{PREFIX} not restored: {outcome.reason}; starting from the bundles")
    return None


def handed_over(host: str, port: int, api_key: str | None, reject_unknown_fields: bool) -> dict[str, object]:
    """What differs per start, read by the restored process right after the restore
    (prebake.engine.bundled.parked): the address, the API key (--api-key, else PREBAKE_API_KEY, as
    the usual start reads it), --reject-unknown-fields and its variable (the restored process reads
    it as the usual start does), when this start began (this process's start, as the kernel has it),
    and the OpenMP waits this host's operator set (the restored process chooses its own otherwise)."""
    return {
        "host": host,
        "port": port,
        "api_key": api_key or os.environ.get(API_KEY_VARIABLE) or None,
        "reject_unknown_fields": reject_unknown_fields,
        "reject_unknown_fields_variable": os.environ.get(REJECT_UNKNOWN_FIELDS_VARIABLE, ""),
        "began": time.time() - _process_age_s(),
        "openmp": openmp.operators(os.environ),  # this host's waits, if its operator set them
    }


def _process_age_s() -> float:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


def _recipe_bakes_one(request: StartRequest) -> bool:
    """Whether the recipe asks for a snapshot ([snapshot] bake = true); a recipe that does not load
    is the usual start's to report."""
    from prebake.artifacts.recipe.schema import load_recipe

    try:
        return load_recipe(request.model).snapshot.bake
    except PrebakeError:
        return False


def _relayed(line: str) -> None:
    """The restored process's own lines (it formats its log already), passed through as they are."""
    print(line, file=sys.stderr, flush=True)
