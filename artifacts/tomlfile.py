"""Reading an operator's TOML file into a frozen pydantic model, with errors that say where and how to fix it.

    load_toml(path, Recipe, what="recipe", error=RecipeError, fix="recipes/README.md lists every field")

Every problem is one `error` (a PrebakeError subclass of the caller's) naming the file: missing,
unreadable, not valid TOML (with its line and column), or not valid against the model, one line
per field (`line 12: serving.blok_size: unknown field; remove it or check its spelling`). The
line of a field comes from the file's table headers and keys (tomllib keeps no positions): the
line of the key itself, else of the table that should hold it. Reads the one file; writes nothing.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from prebake.artifacts.errors import PrebakeError

M = TypeVar("M", bound=BaseModel)
_HEADER = re.compile(r"^\[(\[?)\s*([^\[\]]+?)\s*\]\]?$")
_KEY = re.compile(r"""^((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")


def load_toml(
    path: Path | str,
    model: type[M],
    *,
    what: str,
    error: type[PrebakeError],
    fix: str,
    not_found: type[PrebakeError] | None = None,
) -> M:
    """`path` read as TOML and validated as `model`; `error` naming the file, the line and `fix`."""
    path = Path(path).expanduser()
    name = f"{what} {path}"
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise (not_found or error)(f"{name} does not exist; {fix}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{name} cannot be read ({getattr(exc, 'strerror', None) or exc}); {fix}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{name} is not valid TOML: {exc}; fix the syntax at that line") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        deeper = [e["loc"] for e in errors]  # a container that failed because an element did is said once
        errors = [
            e
            for e in errors
            if not (e["loc"] and any(len(d) > len(e["loc"]) and d[: len(e["loc"])] == e["loc"] for d in deeper))
        ]
        problems = [_problem(text, err["loc"], err["type"], err["msg"], err.get("input")) for err in errors]
        raise error("\n  ".join([f"{name} is not valid:", *problems]) + f"\n{fix}") from None


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the file writes it: rules[0].keys, serving.block_size."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _problem(text: str, loc: tuple[int | str, ...], kind: str, message: str, got: object) -> str:
    if kind == "extra_forbidden":
        said = "unknown field; remove it or check its spelling"
    elif kind == "missing":
        said = "required field is missing; add it"
    elif kind == "value_error":
        said = message.removeprefix("Value error, ")
    else:
        said = f"{message} (got {got!r})"
    line = _line_of(text, loc)
    return f"{f'line {line}: ' if line else ''}{field_path(loc)}: {said}"


def _line_of(text: str, loc: tuple[int | str, ...]) -> int | None:
    """The line that best holds `loc`: the key with the longest matching path, else its table's header."""
    table: tuple[int | str, ...] = ()
    seen: dict[tuple[str, ...], int] = {}  # array-of-tables path -> how many so far
    best: tuple[int, int] | None = None  # (matched length, line)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if header := _HEADER.match(line):
            names = tuple(_names(header.group(2)))
            if header.group(1):  # [[array.of.tables]]: the next element
                seen[names] = seen.get(names, -1) + 1
                table = (*names, seen[names])
            else:
                table = names
            path: tuple[int | str, ...] = table
        elif key := _KEY.match(line):
            path = (*table, *_names(key.group(1)))
        else:
            continue
        matched = _common(path, loc)
        if matched == len(path) and (best is None or matched > best[0]):
            best = (matched, number)
    return None if best is None or best[0] == 0 else best[1]


def _names(dotted: str) -> list[str]:
    return [part.strip().strip("\"'") for part in re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", dotted)]


def _common(path: tuple[int | str, ...], loc: tuple[int | str, ...]) -> int:
    n = 0
    for a, b in zip(path, loc, strict=False):
        if a != b:
            break
        n += 1
    return n
