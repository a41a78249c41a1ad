"""Fields a request sent that this API does not know: ignored and said, or refused by the operator's choice.

vLLM accepts unknown fields and logs them (its request models are `extra="allow"`; vllm PR
#10463 reverted the 2024 forbid because it "breaks compatibility with lots of systems"), and the
clients built for it send its extras. So by default an unknown field costs nothing: each name is
logged once per server (with the known field it is probably a misspelling of: `max_token` ->
`max_tokens`), and every answer that ignored some names them in the `X-Ignored-Fields` header.
`prebake serve --reject-unknown-fields` (or PREBAKE_REJECT_UNKNOWN_FIELDS=1) keeps OpenAI's
strict answer instead: a 400 that names the fields and the close known names.
"""

from __future__ import annotations

import difflib
import logging
import threading

from pydantic import BaseModel

from prebake.engine.bundled.api.errors import ApiError

IGNORED_HEADER = "X-Ignored-Fields"
MAX_HEADER = 1024
MAX_LOGGED = 1024  # names remembered as logged; past that, new names are no longer logged (a bounded set)
log = logging.getLogger("prebake.serve")


def extra_fields(model: BaseModel, at: str = "") -> list[tuple[str, str | None]]:
    """Every unknown field of `model` and its sub-models, as (path, the known field it is close to)."""
    known = list(type(model).model_fields)
    found = [(at + name, _close(name, known)) for name in (model.model_extra or {})]
    for name in known:
        value = getattr(model, name)
        items = value if isinstance(value, list) else [value]
        for i, item in enumerate(items):
            if isinstance(item, BaseModel):
                where = f"{at}{name}[{i}]." if isinstance(value, list) else f"{at}{name}."
                found += extra_fields(item, where)
    return found


def _close(name: str, known: list[str]) -> str | None:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return match[0] if match else None


def _named(path: str, close: str | None) -> str:
    return f"{path} (did you mean {close!r}?)" if close else path


class UnknownFields:
    """The server's policy for unknown fields: ignore and say (the default), or refuse."""

    def __init__(self, reject: bool = False):
        self.reject = reject
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def check(self, body: BaseModel) -> tuple[str, ...]:
        """The unknown fields of `body` (ignored), or an ApiError 400 naming them when refused."""
        found = extra_fields(body)
        if not found:
            return ()
        if self.reject:
            listed = ", ".join(_named(path, close) for path, close in found)
            raise ApiError(
                400,
                f"unknown field(s) {listed}: not part of this API; this server refuses unknown fields "
                f"(--reject-unknown-fields): check the spelling or leave them out",
                found[0][0],
            )
        with self._lock:
            room = MAX_LOGGED - len(self._logged)
            new = [(path, close) for path, close in found if path not in self._logged][: max(0, room)]
            self._logged.update(path for path, _ in new)
        if new:
            log.warning(
                "prebake serve: the request fields %s are not part of this API and were ignored "
                "(each named once; --reject-unknown-fields refuses them)",
                ", ".join(_named(path, close) for path, close in new),
            )
        return tuple(path for path, _ in found)

    @staticmethod
    def header(ignored: tuple[str, ...]) -> dict[str, str]:
        """The response header naming `ignored` (ASCII, control characters escaped, at most MAX_HEADER long)."""
        if not ignored:
            return {}
        text = ", ".join(ignored).encode("ascii", "backslashreplace").decode("ascii")
        text = "".join(c if " " <= c <= "~" else repr(c)[1:-1] for c in text)
        return {IGNORED_HEADER: text if len(text) <= MAX_HEADER else text[: MAX_HEADER - 3] + "..."}
