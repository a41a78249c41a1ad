"""The process a snapshot is taken of, and what it does once restored (docs/snapshots.md).

start      the bundled engine's start from the bake's own bundles: lookup, load, warm-up of every
           step shape; the scheduler, tokenizer and chat template. No port bound, no request state.
park       the heap trimmed and the steps run again; stdin, stdout and stderr are its only
           descriptors besides CONTROL_FD; its file mappings' present pages recorded
           (snapshot/resident.py); it prints READY_LINE and blocks reading CONTROL_FD: the dump
restored   the read returns the per-start settings (one JSON line from restore.py); AMX's permission
           asked again (snapshot/xstate.py), the recorded pages mapped again, OpenMP's waits chosen
           on this host (runtime/openmp.py); it binds, serves, and stops when SIGTERM comes or
           CONTROL_FD closes (its supervisor is gone)
"""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time

import uvicorn

from prebake.engine.bundled.api.app import create_app
from prebake.engine.bundled.api.fields import UnknownFields
from prebake.engine.bundled.api.guard import GuardSettings, trim_heap
from prebake.engine.bundled.api.state import AppState
from prebake.engine.bundled.runtime import openmp
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.serve import (
    REJECT_UNKNOWN_FIELDS_VARIABLE,
    ServeSettings,
    _bind,
    _exit_on_signal,
    _ready,
    _serve_steps,
    reject_unknown_fields_from,
)
from prebake.engine.bundled.snapshot import resident, xstate
from prebake.engine.bundled.snapshot.image import CONTROL_FD, EXIT_PREFIX, READY_LINE
from prebake.engine.bundled.start import start
from prebake.engine.common.adapter import OpenServices, StartRequest


def serve_parked(request: StartRequest, open_services: OpenServices) -> int:
    """Start, park until restored (the dump is taken while parked), then serve what was handed over."""

    def emit(line: str) -> None:
        print(line, flush=True)

    metrics = Metrics()
    engine = start(request, metrics, emit, open_services)
    state = AppState(request.model, metrics)
    scheduler = _ready(engine, state, emit)
    _load_http(state)
    _hold_no_files(engine)
    _release_freed_memory(engine)
    pages = resident.record()
    amx = xstate.permitted()
    settings = _park()
    if (refused := xstate.ask_again(amx)) is not None:  # before any kernel runs: CRIU dropped it
        print(f"prebake serve: snapshot: {refused}", flush=True)
        raise SystemExit(1)  # before ready: the supervisor starts the usual way
    print(resident.populate(pages).line(), flush=True)  # as ready as the start it was taken of
    waits = openmp.restored_waits(settings.get("openmp", {}), handed=settings.get("cores"))
    print(f"prebake serve: snapshot: {waits.line()}", flush=True)
    return _serve(engine, scheduler, state, settings)


def _load_http(state: AppState) -> None:
    """Import what the HTTP server imports as it starts (its protocols, the app's routes) before the
    dump, so neither the restore nor its first request pays for it."""
    guard = GuardSettings(None, 1 << 22, 30.0, max_bodies_bytes=1 << 26)
    uvicorn.Config(create_app(state, guard), log_config=None, access_log=False, lifespan="off").load()


def _hold_no_files(engine) -> None:
    """The trees stay in the store and the run folder stays (AOTInductor's .so files it maps may lie
    in it: the dump carries them); no lock file is held across the dump (a restore on another host
    would find none to take)."""
    engine.leases.close()
    engine.store.release_scratch(engine.run_dir)


def _release_freed_memory(engine) -> None:
    """Give the heap's freed pages back to the kernel before the dump: CRIU writes every resident
    anonymous page, and malloc keeps what the start freed (a GGUF dequantized on this start: 0.3 GB
    of SmolLM2's 0.5 GB in fp32). The weights stay views of their file's private mapping, which
    CRIU maps again from the file instead of writing it (docs/snapshots.md). Then every step shape
    runs once more: the trim gave back the free chunks the steps' buffers come from, and without
    their pages in the image the first request after a restore would fault them in (tiny-llama:
    1-1.5 MB, 250-370 faults), where a prebaked start has them from its warm-up."""
    gc.collect()
    trim_heap()  # glibc's malloc_trim; without it (another C library) the pages stay in the image
    engine.steps.warm_up(engine.tactics, log=lambda line: None)


def _park() -> dict:
    """Say so and block until restored: the read that the dump interrupts, restarted after restore."""
    print(READY_LINE, flush=True)
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(CONTROL_FD, 1 << 16)
        if not chunk:  # the baker went away without dumping: nothing to serve
            raise SystemExit(0)
        line += chunk
    return json.loads(line)


def _serve(engine, scheduler, state, settings: dict) -> int:
    """Bind the port handed over, serve until SIGTERM or until the supervisor's pipe closes."""
    variable = {REJECT_UNKNOWN_FIELDS_VARIABLE: str(settings["reject_unknown_fields_variable"])}
    state.unknown_fields = UnknownFields(reject_unknown_fields_from(bool(settings["reject_unknown_fields"]), variable))
    sock = _bind(settings["host"], settings["port"])
    limits = ServeSettings.model_fields  # the body limits: the usual start's defaults (no flag sets them)
    guard = GuardSettings(
        settings["api_key"],
        limits["max_body_bytes"].default,
        limits["body_timeout_s"].default,
        max_bodies_bytes=limits["max_bodies_bytes"].default,
    )
    config = uvicorn.Config(
        create_app(state, guard), log_config=None, access_log=False, timeout_graceful_shutdown=5, lifespan="off"
    )
    server = uvicorn.Server(config)
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="prebake-http", daemon=True)
    http.start()
    deadline = time.monotonic() + 10.0
    while not server.started and http.is_alive() and time.monotonic() < deadline:  # accepting before ready
        time.sleep(0.002)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    threading.Thread(target=_stop_when_control_closes, name="prebake-control", daemon=True).start()
    host, port = sock.getsockname()[:2]
    print(f"prebake serve: listening on http://{host}:{port} (/health is 503 until ready)", flush=True)
    ready_s = time.time() - settings["began"]
    state.metrics.set("prebake_time_to_ready_seconds", round(ready_s, 3))
    state.metrics.set("prebake_ready", 1)
    print(
        f"prebake serve: ready: {engine.plan.target.name} on http://{host}:{port} "
        f"(restored from its snapshot, {ready_s:.2f} s after the start began)",
        flush=True,
    )
    stop = threading.Event()
    code = 0
    try:
        _serve_steps(scheduler, state, stop, lambda line: print(line, flush=True))
    except SystemExit as exc:
        print("prebake serve: stopping", flush=True)
        code = int(exc.code or 0)
    finally:
        stop.set()
        server.should_exit = True
        http.join(10)
        sock.close()
        engine.close(keep_run_dir=True)  # other restores of this image map files from it: swept once none holds it
    print(f"{EXIT_PREFIX}{code}", flush=True)  # CRIU does not pass on how it ended: the supervisor reads it here
    return code


def _stop_when_control_closes() -> None:
    while os.read(CONTROL_FD, 1 << 12):
        pass
    os.kill(os.getpid(), signal.SIGTERM)
