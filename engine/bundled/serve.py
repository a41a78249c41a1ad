"""`prebake serve` for the bundled engine: listen first, start the engine, then serve until a signal.

    listen      bind host:port (0 picks a free port), uvicorn serves the FastAPI app
                (prebake.engine.bundled.api) on its own thread; /health says 503 with the current
                start-up step, /health/live 200, all through fetch, compile and warm-up
    start       prebake.engine.bundled.start.start(request, metrics, emit, open_services): the warm engine
    ready       the scheduler's thread, the tokenizer and chat template; /health turns 200
    stop        SIGTERM/SIGINT: uvicorn finishes, the scheduler stops, the engine's folder goes
    --tp N      this process supervises N ranks (ranks.py): rank 0 does the above, the others follow

The default address is 127.0.0.1; in a container listen on 0.0.0.0 (--host), with --api-key.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn
from pydantic import BaseModel, ConfigDict, Field

from prebake.artifacts.errors import PrebakeError
from prebake.engine.bundled.api.app import create_app
from prebake.engine.bundled.api.chat import ChatTemplateError, chat_template_for
from prebake.engine.bundled.api.fields import UnknownFields
from prebake.engine.bundled.api.guard import GuardSettings
from prebake.engine.bundled.api.state import AppState, Serving
from prebake.engine.bundled.ranks import RankContext, read_notices, supervise
from prebake.engine.bundled.runtime.metrics import Metrics
from prebake.engine.bundled.runtime.tokenizer import TokenizerError, tokenizer_for
from prebake.engine.bundled.start import Engine, start
from prebake.engine.common.adapter import OpenServices, StartRequest
from prebake.engine.common.starter import MissRefused

if TYPE_CHECKING:  # torch: loaded by start(), once the environment is set
    from prebake.engine.bundled.runtime.scheduler import Scheduler

API_KEY_VARIABLE = "PREBAKE_API_KEY"
REJECT_UNKNOWN_FIELDS_VARIABLE = "PREBAKE_REJECT_UNKNOWN_FIELDS"


class ServeSettings(BaseModel):
    """`prebake serve`'s options: what to start and where to listen."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    request: StartRequest  # what to start (prebake.engine.bundled.start)
    eager: bool = False  # --eager: compilation off
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port (logged)")
    api_key: str | None = Field(default=None, min_length=1, repr=False)
    max_body_bytes: int = Field(default=4 << 20, gt=0)
    max_bodies_bytes: int = Field(default=64 << 20, gt=0, description="every body in flight, together")
    body_timeout_s: float = Field(default=30.0, gt=0)
    reject_unknown_fields: bool = False  # --reject-unknown-fields: a 400, not ignored and said (api.fields)


class ListenError(PrebakeError, OSError):
    """The server's address cannot be bound."""


def serve(settings: ServeSettings, open_services: OpenServices, emit: Callable[[str], None]) -> int:
    """Listen, start the engine (its store, registry and host from `open_services`), serve until
    SIGTERM/SIGINT; the exit status. At --tp N: supervise N ranks, or be one of them."""
    rank = RankContext.from_environ()
    if rank is None and (settings.request.tp or 1) > 1:
        sock = _bind(settings.host, settings.port, listen=False)  # rank 0's uvicorn listens: until then, refused
        host, port = sock.getsockname()[:2]
        emit(f"prebake serve: listening on http://{host}:{port} (/health is 503 until ready)")
        return supervise(settings.request.tp or 1, sock, emit)
    if rank is not None and rank.rank > 0:
        return _follow(settings, open_services, emit, rank)
    metrics = Metrics(settings.request.model)
    metrics.set("prebake_ready", 0)
    state = AppState(settings.request.model, metrics, unknown_fields=UnknownFields(settings.reject_unknown_fields))
    sock = _bind(settings.host, settings.port) if rank is None else socket.socket(fileno=rank.listen_fd)
    if rank is not None:
        threading.Thread(target=read_notices, args=(rank.notice_fd, state.stop_because), daemon=True).start()
    guard = GuardSettings(
        settings.api_key, settings.max_body_bytes, settings.body_timeout_s, max_bodies_bytes=settings.max_bodies_bytes
    )
    config = uvicorn.Config(
        create_app(state, guard), log_config=None, access_log=False, timeout_graceful_shutdown=5, lifespan="off"
    )
    server = uvicorn.Server(config)
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="prebake-http", daemon=True)
    http.start()
    host, port = sock.getsockname()[:2]
    if rank is None:  # a rank's supervisor said it
        emit(f"prebake serve: listening on http://{host}:{port} (/health is 503 until ready)")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    engine = None
    stop = threading.Event()
    try:
        engine = start(
            settings.request,
            metrics,
            emit,
            open_services,
            eager=settings.eager,
            progress=lambda step: setattr(state, "step", step),
            rank=rank,
        )
        if engine.parallel is not None:  # every step from here on is broadcast to the other ranks
            from prebake.engine.bundled.runtime.lockstep import Lockstep

            engine.steps = Lockstep(engine.steps)
        scheduler = _ready(engine, state, emit)
        ready_s = _seconds_since_process_start()
        metrics.set("prebake_time_to_ready_seconds", round(ready_s, 3))
        metrics.set("prebake_ready", 1)
        emit(
            f"prebake serve: ready: {engine.plan.target.name} on http://{host}:{port} "
            f"({ready_s:.2f} s after the process started)"
        )
        _serve_steps(scheduler, state, stop, emit)
        return 0
    except MissRefused as exc:
        emit(f"prebake serve: {exc}")
        return exc.code
    except SystemExit as exc:
        emit("prebake serve: stopping")
        return int(exc.code or 0)
    finally:
        stop.set()
        server.should_exit = True
        http.join(10)
        sock.close()
        if engine is not None:
            if state.stopping is not None and hasattr(engine.steps, "abandon"):  # a rank is gone
                engine.steps.abandon()
            engine.close()


def _follow(
    settings: ServeSettings, open_services: OpenServices, emit: Callable[[str], None], rank: RankContext
) -> int:
    """Rank 1..N-1: start like rank 0 (its own shard), then run every step rank 0 broadcasts."""
    from prebake.engine.bundled.runtime.lockstep import follow, leave

    def said(line: str) -> None:
        emit(f"[rank {rank.rank}] {line}")

    try:
        engine = start(settings.request, Metrics(), said, open_services, eager=settings.eager, rank=rank)
    except MissRefused as exc:
        said(f"prebake serve: {exc}")
        return exc.code
    try:
        said(f"prebake serve: rank {rank.rank} ready: following rank 0's steps")
        follow(engine.steps)
        return 0
    finally:
        engine.close()
        leave()


def _bind(host: str, port: int, listen: bool = True) -> socket.socket:
    """The listening socket, bound before start-up so a taken port fails at once. Unless `listen`:
    bound only (connections refused, as before any bind), for rank 0 to listen on once it serves."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        if listen:
            sock.listen(2048)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; {_listen_fix(exc, host, port)}"
        ) from exc
    sock.set_inheritable(True)
    return sock


def _listen_fix(exc: OSError, host: str, port: int) -> str:
    """What to change when an address cannot be bound: the port when it is taken, else the host."""
    if exc.errno == errno.EADDRINUSE:
        return "another process listens there: pick another --port (0 picks a free one)"
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return "ports below 1024 need privileges: pick --port 1024 or above (default 8000)"
    if isinstance(exc, socket.gaierror):
        return f"--host {host!r} is not a name or address this machine can resolve: give an IP address or a host name"
    return (
        f"--host {host} is not an address of this machine: use 127.0.0.1 (this machine only), 0.0.0.0 "
        f"(every interface, e.g. in a container) or one of its own addresses"
    )


def _serve_steps(scheduler: Scheduler, state: AppState, stop: threading.Event, emit: Callable[[str], None]) -> None:
    """The serving loop, on this thread: the one whose start warmed the steps up. libgomp keeps a
    thread pool per thread that opens parallel regions, and once two pools hold more threads than
    there are cores it shortens every wait to a sleep (tiny-llama's package: a decode step 1.6 ms on
    the thread that warmed it, 9.4 ms on another, two threads on two cores; docs/performance.md).
    A signal ends it after the step in progress (SystemExit, as before); a loop that dies of a bug
    leaves the server up with /health/live at 503, for the orchestrator to restart it."""
    try:
        scheduler.serve_forever(stop)
    except Exception as exc:
        state.alive = lambda: False
        emit(f"prebake serve: the serving loop stopped: {exc!r}")
        stop.wait()


def _ready(engine: Engine, state: AppState, emit: Callable[[str], None]) -> Scheduler:
    from prebake.engine.bundled.runtime.loader import model_folder  # torch, as the scheduler
    from prebake.engine.bundled.runtime.scheduler import (
        Scheduler,  # torch: loaded by start(), once the environment is set
    )

    metrics = state.metrics

    def observe(shape, rows: int) -> None:
        metrics.add("prebake_steps_total", shape=shape.name)
        metrics.add("prebake_step_rows_total", rows, shape=shape.name)

    recipe = engine.recipe
    scheduler = Scheduler(engine.steps, engine.buckets, engine.tactics, recipe.serving.max_model_len, observe)
    config = engine.steps.model.config
    folder = model_folder(recipe.model, engine.plan.target.dtype)
    try:
        tokenizer = tokenizer_for(recipe.model, config.vocab_size, folder)
    except TokenizerError as exc:  # token-id prompts still work: say so and serve
        emit(f"prebake serve: no tokenizer, text prompts will be refused: {exc}")
        tokenizer = None
    try:
        chat = chat_template_for(recipe.model, folder)
    except ChatTemplateError as exc:
        emit(f"prebake serve: no chat template, chat requests will be refused: {exc}")
        chat = None
    state.serving = Serving(
        scheduler=scheduler,
        tokenizer=tokenizer,
        chat=chat,
        eos=frozenset(config.eos_token_ids),
        target=engine.plan.target.name,
        max_model_len=recipe.serving.max_model_len,
        created=int(time.time()),
    )
    return scheduler


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _seconds_since_process_start() -> float:
    """From this process's start (as the kernel records it) to now; Linux, else since import."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - ticks / _CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return time.monotonic() - _IMPORTED


_IMPORTED = time.monotonic()
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def api_key_from(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """--api-key, else PREBAKE_API_KEY, else none (no authentication)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    return flag or env.get(API_KEY_VARIABLE) or None


def reject_unknown_fields_from(flag: bool, environ: Mapping[str, str] | None = None) -> bool:
    """--reject-unknown-fields, else PREBAKE_REJECT_UNKNOWN_FIELDS (1, true, yes), else off."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    value = env.get(REJECT_UNKNOWN_FIELDS_VARIABLE, "").strip().lower()
    if value not in ("", "0", "false", "no", "1", "true", "yes"):
        raise PrebakeError(
            f"{REJECT_UNKNOWN_FIELDS_VARIABLE}={env[REJECT_UNKNOWN_FIELDS_VARIABLE]!r} is not a switch; set it to 1 or 0"
        )
    return flag or value in ("1", "true", "yes")
