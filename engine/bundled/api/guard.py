"""What every request passes before a route sees it: the API key, then a bounded body.

    API key     with a key set, every route but the probes (/health, /health/live) needs
                `Authorization: Bearer <key>`; compared in constant time (hmac.compare_digest)
    body        at most `max_body_bytes` (413 past it, by Content-Length or by counting),
                read within `body_timeout_s` (408 for a client that dribbles), and UTF-8 (400);
                read as JSON when it comes unlabelled or labelled a form (`curl -d` does that)

The body is read here in full and replayed to the route, so a slow or oversized upload never
ties up anything but its own connection. Later receive() calls (the disconnect a streaming
response listens for) go to the client's connection as before.
"""

from __future__ import annotations

import asyncio
import hmac
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prebake.engine.bundled.api.errors import error_response

PROBES = frozenset({"/health", "/health/live"})


@dataclass(frozen=True)
class GuardSettings:
    api_key: str | None = None
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 30.0


class Guard:
    """Pure ASGI middleware (no per-request task, so streaming stays untouched)."""

    def __init__(self, app: ASGIApp, settings: GuardSettings):
        self.app, self.settings = app, settings
        self._key = None if settings.api_key is None else f"Bearer {settings.api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._key is not None and scope["path"] not in PROBES and not self._authorized(scope):
            response = error_response(
                401,
                "missing or wrong API key: send the header `Authorization: Bearer <key>` "
                "with the key the server was started with (--api-key or PREBAKE_API_KEY)",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        body, problem = await self._read_body(scope, receive)
        if problem is not None:
            await problem(scope, receive, send)
            return
        if body is None:  # the client went away while sending
            return
        await self.app(_as_json(scope), _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        assert self._key is not None
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        return hmac.compare_digest(given, self._key)

    async def _read_body(self, scope: Scope, receive: Receive):
        cap = self.settings.max_body_bytes
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > cap):
            return None, _too_large(cap)
        body = bytearray()
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None, None
                    body += message.get("body", b"")
                    if len(body) > cap:
                        return None, _too_large(cap)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            return None, error_response(
                408, f"the request body did not arrive within {self.settings.body_timeout_s:g} s; send it at once"
            )
        if body and scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                return None, error_response(
                    400, f"the request body is not UTF-8 (byte {exc.start}: {exc.reason}); send JSON encoded as UTF-8"
                )
        return bytes(body), None


_FORM = b"application/x-www-form-urlencoded"


def _as_json(scope: Scope) -> Scope:
    """Every body this API takes is JSON: one sent unlabelled, or labelled a form as `curl -d` does, is read as JSON."""
    if scope["method"] != "POST":
        return scope
    kind = next((v for k, v in scope["headers"] if k == b"content-type"), None)
    if kind is not None and not kind.startswith(_FORM):
        return scope
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [(b"content-type", b"application/json")]
    return {**scope, "headers": headers}


def _too_large(cap: int):
    return error_response(413, f"the request body is larger than {cap} bytes; send a shorter prompt")


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
