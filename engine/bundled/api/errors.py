"""Every failure as OpenAI clients parse it: {"error": {"message", "type", "param", "code"}}.

    ApiError                raised by routes: a status, a message that says the fix, the param
    RequestValidationError  pydantic's verdict on a body (wrong type, unknown field, bad bound): 400
    HTTPException           FastAPI's own (unknown route 404, wrong method 405, unparsable body)
    anything else           500, logged with its traceback; the server keeps serving

The `type` follows OpenAI's names: invalid_request_error (4xx), authentication_error (401),
server_error (5xx), so the openai client raises BadRequestError, AuthenticationError and so on.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from prebake.engine.bundled.api.schema import ErrorBody, ErrorResponse

log = logging.getLogger(__name__)
_MAX_LISTED = 5  # validation errors named in one message


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    kind = (
        "authentication_error"
        if status == 401
        else "not_found_error"
        if status == 404
        else "invalid_request_error"
        if status < 500
        else "server_error"
    )
    body = ErrorResponse(error=ErrorBody(message=message, type=kind, param=param, code=status))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.param)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    by_field: dict[str, list[dict]] = {}
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        field = "body" if error.get("type") == "json_invalid" or not loc else loc[0]
        if field == "body" and error.get("type") == "not_supported":  # raised by a model validator: its field
            field = str(error.get("ctx", {}).get("field", field))
        by_field.setdefault(field, []).append(error)
    parts = []
    for field, errors in list(by_field.items())[:_MAX_LISTED]:
        if len(errors) > 1 and field in _FORMS:  # a union: one line naming the accepted forms
            parts.append(f"{field}: must be {_FORMS[field]}; {_reason(errors[0])}")
        else:
            parts.append(f"{_where(errors[0], field)}: {_reason(errors[0])}")
    more = f" (and {len(by_field) - _MAX_LISTED} more)" if len(by_field) > _MAX_LISTED else ""
    message = "invalid request: " + "; ".join(parts) + more
    if (engine := getattr(request.app.state, "engine", None)) is not None and request.url.path.startswith("/v1/"):
        engine.metrics.add("prebake_requests_total", outcome="rejected")
    return error_response(400, message, next(iter(by_field), None))


_FORMS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of such lists",
    "stop": "a string or a list of at most 8 strings",
    "messages": "a list of {role, content} messages",
}


def _where(error: dict, field: str) -> str:
    if field == "body":
        return "body"
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    return ".".join(p for p in loc if not _union_tag(p)) or field


def _union_tag(part: str) -> bool:
    """pydantic's names for the branch of a union ("list[int]", "constrained-str"), not field names."""
    return part in ("str", "int", "float", "bool") or "[" in part or part.startswith("constrained-")


def _reason(error: dict) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown field (not part of this API; check its spelling)"
    if kind == "missing":
        return "required field missing"
    if kind == "json_invalid":
        return f"the body is not valid JSON ({error.get('ctx', {}).get('error', 'parse error')}); send one JSON object"
    if kind == "not_supported":
        return str(error.get("msg"))
    if kind == "literal_error" and "expected" in error.get("ctx", {}):
        return f"not supported by this engine; leave it at {error['ctx']['expected']}"
    given = repr(error.get("input"))
    given = given if len(given) <= 40 else given[:37] + "..."
    return f"{error.get('msg', 'invalid')}, got {given}"


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; see GET /docs for the routes"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
