"""Logging for every prebake command, configured once, through the standard library.

    PREBAKE_LOG_LEVEL    DEBUG, INFO (default), WARNING, ERROR
    PREBAKE_LOG_FORMAT   text (default): `<UTC time> INFO prebake.registry.backends.s3: message`
                         json: one object a line, {"ts", "level", "logger", "message"[, "exc"]}

One handler on the root logger, writing to stderr, reached by every module's logger (uvicorn's
too). Library code only logs; only `configure` (called by the `prebake` command) sets handlers.
`Countdown` writes the "[i/N] ... (~12 s left)" prefix of long loops over every step shape.
`quiet_dependency_deprecations` sends a dependency's deprecation warnings (torch's, at every step
shape a bake compiles) to the debug log once each: a build tool's output shows its own lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

LEVEL_VARIABLE, FORMAT_VARIABLE = "PREBAKE_LOG_LEVEL", "PREBAKE_LOG_FORMAT"
_HANDLER_NAME = "prebake"
_DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
# prebake's own folders, checkout or wheel alike: a warning raised from code under them is ours
_OURS = tuple(str(Path(__file__).resolve().parents[2] / name) + os.sep for name in ("artifacts", "engine", "registry"))


class LogSettingError(ValueError):
    """PREBAKE_LOG_LEVEL or PREBAKE_LOG_FORMAT holds a value prebake does not know."""


def _timestamp(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(environ: Mapping[str, str] | None = None, stream: TextIO | None = None) -> logging.Handler:
    """Install the one handler (again: replaced, never doubled); the handler."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    level_name = env.get(LEVEL_VARIABLE, "INFO").strip().upper() or "INFO"
    level = logging.getLevelNamesMapping().get(level_name)
    if level is None:
        raise LogSettingError(f"{LEVEL_VARIABLE}={level_name!r} is not a level; use DEBUG, INFO, WARNING or ERROR")
    fmt = env.get(FORMAT_VARIABLE, "text").strip().lower() or "text"
    if fmt not in ("text", "json"):
        raise LogSettingError(f"{FORMAT_VARIABLE}={fmt!r} is not a format; use text or json")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    quiet_dependency_deprecations()
    return handler


def quiet_dependency_deprecations() -> None:
    """From now on in this process, a deprecation warning raised in a dependency's code goes to the
    `py.warnings` logger at DEBUG, once per message (torch's own `catch_warnings` blocks reset
    Python's once-per-place memory, so its warnings repeat at every compile); prebake's own warnings
    and every other category show as before. Installed once; a second call changes nothing."""
    shown = warnings.showwarning
    if getattr(shown, "quiets_dependencies", False):
        return
    logged: set[tuple[type[Warning], str]] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, _DEPRECATIONS) or os.path.realpath(filename).startswith(_OURS):
            return shown(message, category, filename, lineno, file, line)
        if (category, str(message)) not in logged:
            logged.add((category, str(message)))
            logging.getLogger("py.warnings").debug("%s:%s: %s: %s", filename, lineno, category.__name__, message)
        return None

    show.quiets_dependencies = True  # type: ignore[attr-defined]
    warnings.showwarning = show


class Countdown:
    """`[i/N]` and the time left, estimated from the mean time of the items done so far.

    countdown = Countdown(len(shapes))
    for shape in shapes:
        ...
        log(countdown.line(f"warm-up {shape.name} 0.41 s"))   # [3/12] warm-up ... (~4 s left)
    """

    def __init__(self, total: int):
        self.total, self.done = total, 0
        self._started = time.perf_counter()

    def line(self, text: str) -> str:
        """Count one item as done; `text` between its count and the estimate of the time left."""
        self.done += 1
        elapsed = time.perf_counter() - self._started
        left = elapsed / self.done * (self.total - self.done)
        width = len(str(self.total))
        return f"[{self.done:>{width}}/{self.total}] {text} (~{_duration(left)} left)"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"
