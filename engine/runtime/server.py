"""The bundled engine's HTTP server: an OpenAI-compatible completions API over the scheduler.

    GET  /health           503 while starting (with the current step), 200 once ready
    GET  /metrics          Prometheus text (engine.runtime.metrics)
    GET  /v1/models        the one model served
    POST /v1/completions   prompt: text, [text, ...], [token ids] or [[token ids], ...];
                           max_tokens, temperature, top_p, seed, ignore_eos; each choice also
                           carries its token_ids

The server listens before start-up begins, so /health says 503 through fetch, compile and
warm-up; completions are refused with 503 until then. Unsupported options (stream, n > 1,
echo, logprobs, stop strings) are refused with 400 rather than silently ignored.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from artifacts.errors import ExitCode, PrebakeError
from engine.runtime.metrics import Metrics
from engine.runtime.tokenizer import Tokenizer, TokenizerError, tokenizer_for
from engine.startup.bundled import Engine, MissRefused, StartupSettings, start

# torch-free at import, so /health answers 503 while torch loads; engine.runtime.scheduler comes later.
if TYPE_CHECKING:
    from engine.runtime.scheduler import Request, Scheduler

_UNSUPPORTED = {"stream": False, "n": 1, "best_of": 1, "echo": False, "logprobs": None, "suffix": None, "stop": None}


class ServeSettings(BaseModel):
    """`prebake serve`'s options: what to start and where to listen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    startup: StartupSettings
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535, description="0 picks a free port (logged)")


@dataclass
class _Serving:
    """What the request handlers need once the engine is ready."""

    engine: Engine
    scheduler: Scheduler
    tokenizer: Tokenizer | None
    created: int


class _State:
    def __init__(self, model_id: str, metrics: Metrics):
        self.model_id, self.metrics = model_id, metrics
        self.serving: _Serving | None = None
        self.step = "starting"


class ListenError(PrebakeError, OSError):
    """The server's address cannot be bound."""


class _BadRequest(ValueError):
    def __init__(self, message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def serve(settings: ServeSettings, emit: Callable[[str], None]) -> int:
    """Listen, start the engine, serve until SIGTERM/SIGINT; the exit status."""
    metrics = Metrics()
    metrics.set("prebake_ready", 0)
    state = _State(settings.startup.model, metrics)
    try:
        httpd = ThreadingHTTPServer((settings.host, settings.port), _handler(state))
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}; "
            f"pick another --port (0 picks a free one)"
        ) from exc
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, name="prebake-http", daemon=True).start()
    host, port = httpd.server_address[:2]
    emit(f"prebake serve: listening on http://{host}:{port} (/health is 503 until ready)")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    engine = None
    stop = threading.Event()
    try:
        engine = start(settings.startup, metrics, emit, progress=lambda step: setattr(state, "step", step))
        state.serving = _ready(engine, stop, metrics, emit)
        ready_s = _seconds_since_process_start()
        metrics.set("prebake_time_to_ready_seconds", round(ready_s, 3))
        metrics.set("prebake_ready", 1)
        emit(
            f"prebake serve: ready: {engine.plan.target.name} on http://{host}:{port} "
            f"({ready_s:.2f} s after the process started)"
        )
        stop.wait()
        return 0
    except MissRefused as exc:
        emit(f"prebake serve: {exc}")
        return ExitCode.MISS
    except SystemExit as exc:
        emit("prebake serve: stopping")
        return int(exc.code or 0)
    finally:
        stop.set()
        httpd.shutdown()
        if engine is not None:
            engine.close()


def _ready(engine: Engine, stop: threading.Event, metrics: Metrics, emit: Callable[[str], None]) -> _Serving:
    from engine.runtime.scheduler import Scheduler

    def observe(shape, rows: int) -> None:
        metrics.add("prebake_steps_total", shape=shape.name)
        metrics.add("prebake_step_rows_total", rows, shape=shape.name)

    scheduler = Scheduler(engine.steps, engine.buckets, engine.tactics, engine.recipe.serving.max_model_len, observe)
    threading.Thread(target=scheduler.serve_forever, args=(stop,), name="prebake-scheduler", daemon=True).start()
    try:
        tokenizer = tokenizer_for(engine.recipe.model, engine.steps.model.config.vocab_size)
    except TokenizerError as exc:  # token-id prompts still work: say so and serve
        emit(f"prebake serve: no tokenizer, text prompts will be refused: {exc}")
        tokenizer = None
    return _Serving(engine, scheduler, tokenizer, int(time.time()))


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


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "prebake"
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args) -> None:  # requests are counted in /metrics, not logged
            return

        def do_GET(self) -> None:
            if self.path == "/health":
                if state.serving is None:
                    self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"status": "starting", "step": state.step})
                else:
                    self._json(HTTPStatus.OK, {"status": "ready", "target": state.serving.engine.plan.target.name})
            elif self.path == "/metrics":
                self._send(HTTPStatus.OK, state.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/v1/models":
                if self._starting():
                    return
                self._json(HTTPStatus.OK, {"object": "list", "data": [_model_card(state)]})
            else:
                self._error(
                    _BadRequest(f"no route GET {self.path}; try /health, /metrics, /v1/models", HTTPStatus.NOT_FOUND)
                )

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._error(_BadRequest(f"no route POST {self.path}; try /v1/completions", HTTPStatus.NOT_FOUND))
                return
            if self._starting():
                return
            from engine.runtime.scheduler import RequestRejected

            started = time.perf_counter()
            try:
                body = self._body()
                self._json(HTTPStatus.OK, _complete(state, body))
                state.metrics.add("prebake_requests_total", outcome="ok")
            except (_BadRequest, RequestRejected) as exc:
                state.metrics.add("prebake_requests_total", outcome="rejected")
                self._error(exc if isinstance(exc, _BadRequest) else _BadRequest(str(exc)))
            except Exception as exc:  # a failed step: the request fails, the server keeps serving
                state.metrics.add("prebake_requests_total", outcome="error")
                self._error(
                    _BadRequest(f"generation failed: {type(exc).__name__}: {exc}", HTTPStatus.INTERNAL_SERVER_ERROR)
                )
            finally:
                state.metrics.observe_latency(time.perf_counter() - started)

        def _starting(self) -> bool:
            if state.serving is None:
                self._error(
                    _BadRequest(
                        f"the engine is starting ({state.step}); poll /health until it says 200",
                        HTTPStatus.SERVICE_UNAVAILABLE,
                    )
                )
                return True
            return False

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _BadRequest(f"the request body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise _BadRequest("the request body must be a JSON object, as OpenAI's completions API takes")
            return body

        def _error(self, exc: _BadRequest) -> None:
            kind = "invalid_request_error" if exc.status < 500 else "server_error"
            self._json(
                exc.status, {"error": {"message": str(exc), "type": kind, "param": exc.param, "code": exc.status.value}}
            )

        def _json(self, status: HTTPStatus, payload: dict) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: HTTPStatus, data: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _model_card(state: _State) -> dict:
    serving = state.serving
    plan = serving.engine.plan
    return {
        "id": state.model_id,
        "object": "model",
        "created": serving.created,
        "owned_by": "prebake",
        "root": plan.target.name,
        "max_model_len": plan.recipe.serving.max_model_len,
    }


def _complete(state: _State, body: dict) -> dict:
    serving = state.serving
    model = body.get("model", state.model_id)
    if model != state.model_id:
        raise _BadRequest(
            f"model {model!r} is not served here; this server serves {state.model_id!r}", HTTPStatus.NOT_FOUND, "model"
        )
    for name, default in _UNSUPPORTED.items():
        if body.get(name, default) != default:
            raise _BadRequest(
                f"{name}={body[name]!r} is not supported by the bundled engine; leave it at {default!r}", param=name
            )
    prompts = _prompts(body.get("prompt"), serving.tokenizer)
    requests = [_request(body, p, serving) for p in prompts]
    for request in requests:  # all or nothing: no prompt of a refused request is queued
        serving.scheduler.limits.check(request)
    futures: list[Future] = [serving.scheduler.submit(r) for r in requests]
    completions = [f.result() for f in futures]
    state.metrics.add("prebake_generated_tokens_total", sum(len(c.tokens) for c in completions))
    choices = [
        {
            "index": i,
            "text": serving.tokenizer.decode(list(c.tokens)) if serving.tokenizer else "",
            "token_ids": list(c.tokens),
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }
        for i, c in enumerate(completions)
    ]
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(c.tokens) for c in completions)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_id,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _prompts(prompt, tokenizer: Tokenizer | None) -> list[list[int]]:
    """OpenAI's four prompt forms, as token ids."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt)):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise _BadRequest(
            "prompt must be a string, a list of strings, a list of token ids or a list of such lists", param="prompt"
        )
    out = []
    for p in prompt:
        if isinstance(p, str):
            if tokenizer is None:
                raise _BadRequest(
                    "this model has no tokenizer (no tokenizer.json in its folder; see the start-up "
                    "log), so text prompts cannot be encoded; send token ids",
                    param="prompt",
                )
            out.append(tokenizer.encode(p))
        elif isinstance(p, list) and all(_is_id(t) for t in p):
            out.append(list(p))
        else:
            raise _BadRequest(
                f"prompt entry {str(p)[:40]!r} is neither a string nor a list of token ids", param="prompt"
            )
    return out


def _request(body: dict, prompt: list[int], serving: _Serving) -> Request:
    from engine.runtime.scheduler import Request

    def number(name: str, default, kind):
        value = body.get(name, default)
        if value is None:
            return default
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or (kind is int and not isinstance(value, int))
        ):
            raise _BadRequest(
                f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}", param=name
            )
        return kind(value)

    eos = frozenset(serving.engine.steps.model.config.eos_token_ids)
    seed = body.get("seed")
    if seed is not None and not _is_id(seed):
        raise _BadRequest(f"seed must be a non-negative integer, got {seed!r}", param="seed")
    return Request(
        prompt=tuple(prompt),
        max_tokens=number("max_tokens", 16, int),
        temperature=number("temperature", 1.0, float),
        top_p=number("top_p", 1.0, float),
        seed=seed,
        stop_ids=frozenset() if body.get("ignore_eos") else eos,
    )


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
