"""The bundled engine's HTTP API on FastAPI: probes, metrics, models, tokenizer routes, completions.

    GET  /health, /health/live   ready (503 with the start-up step before), alive; NIM's /v1/health/*
    GET|POST /ping, GET /load    ready, as /health; {"server_load": requests being answered} (vLLM's)
    GET  /metrics, /version      Prometheus text (runtime.metrics, prebake's names and vLLM's); prebake's version
    GET  /v1/models              the one model served
    POST /v1/completions, /v1/chat/completions   OpenAI's, streamed with stream=true
    POST /tokenize, /detokenize  text or chat messages to token ids and back

Bodies are api.schema models, errors api.errors' shape; api.guard checks the API key and bounds
the body before any route runs. Until the engine is ready, every route but the probes and
/metrics answers 503. Every route in full: docs/http-api.md.
"""

from __future__ import annotations

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

import prebake
from prebake.engine.bundled.api import completions, errors
from prebake.engine.bundled.api.guard import Guard, GuardSettings
from prebake.engine.bundled.api.schema import (
    DetokenizeRequest,
    ModelCard,
    ModelList,
    Text,
    TokenizeRequest,
    Tokens,
)
from prebake.engine.bundled.api.state import AppState
from prebake.engine.bundled.runtime.metrics import CONTENT_TYPE


def create_app(state: AppState, guard: GuardSettings) -> FastAPI:
    app = FastAPI(title="prebake bundled engine", version=_version(), openapi_url="/openapi.json")
    app.state.engine = state
    errors.add_error_handlers(app)
    app.add_middleware(_LoadTracker, state=state)  # added first, so inside the guard: a refused request is no load
    app.add_middleware(Guard, settings=guard)
    _probe_routes(app, state)
    _info_routes(app, state)
    completions.add_routes(app, state)
    return app


READY_PATHS = ("/health", "/v1/health/ready")  # ours (vLLM's), and NVIDIA NIM's
LIVE_PATHS = ("/health/live", "/v1/health/live")


def _probe_routes(app: FastAPI, state: AppState) -> None:
    def health() -> JSONResponse:
        if state.stopping is not None:
            return JSONResponse({"status": "stopping", "reason": state.stopping}, status_code=503)
        if state.serving is None:
            return JSONResponse({"status": "starting", "step": state.step}, status_code=503)
        return JSONResponse({"status": "ready", "target": state.serving.target})

    def live() -> JSONResponse:
        if not state.alive():
            return JSONResponse({"status": "dead", "reason": "the serving loop stopped"}, status_code=503)
        return JSONResponse({"status": "alive", "step": "ready" if state.serving else state.step})

    for path in READY_PATHS:  # HEAD too: load balancers and curl -I probe with it
        app.add_api_route(path, health, methods=["GET", "HEAD"])
    app.add_api_route("/ping", health, methods=["GET", "HEAD", "POST"])

    @app.get("/load")
    def load() -> dict[str, int]:
        return {"server_load": state.in_flight}

    for path in LIVE_PATHS:
        app.add_api_route(path, live, methods=["GET", "HEAD"])

    @app.get("/metrics")
    def metrics() -> Response:
        if state.serving is not None:  # the load as of this scrape
            state.metrics.set_load(state.serving.scheduler.load())
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _info_routes(app: FastAPI, state: AppState) -> None:
    @app.get("/version")
    def get_version() -> dict[str, str]:
        return {"version": _version()}

    @app.get("/v1/models")
    def models() -> ModelList:
        serving = state.ready()
        card = ModelCard(
            id=state.model_id, created=serving.created, root=serving.target, max_model_len=serving.max_model_len
        )
        return ModelList(data=[card])

    @app.post("/tokenize")
    def tokenize(body: TokenizeRequest, response: Response) -> Tokens:
        response.headers.update(state.unknown_fields.header(state.unknown_fields.check(body)))
        serving = state.ready()
        state.check_model(body.model)
        if body.messages is not None:
            ids = completions.chat_prompt(serving, body.messages, body.add_generation_prompt)
        else:
            assert body.prompt is not None  # the model validator takes exactly one of the two
            ids = completions.encode(serving, body.prompt, body.add_special_tokens)
        return Tokens(count=len(ids), max_model_len=serving.max_model_len, tokens=ids)

    @app.post("/detokenize")
    def detokenize(body: DetokenizeRequest, response: Response) -> Text:
        response.headers.update(state.unknown_fields.header(state.unknown_fields.check(body)))
        serving = state.ready()
        state.check_model(body.model)
        return Text(prompt=completions.tokenizer_of(serving).decode(body.tokens))


GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class _LoadTracker:
    """Counts the completion requests being answered, from their arrival to their last byte (a
    stream's too): /load's server_load, as vLLM's --enable-server-load-tracking counts it."""

    def __init__(self, app: ASGIApp, state: AppState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.state.in_flight -= 1


def _version() -> str:
    """prebake's one version (read once), "0+unknown" in a checkout never installed (a version string
    a client can parse)."""
    return "0+unknown" if prebake.__version__ == prebake.NOT_INSTALLED else prebake.__version__
