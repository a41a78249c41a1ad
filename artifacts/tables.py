"""Plain-text tables: how a report renders its rows for people (its `render()`), beside the stable
JSON shape its `to_json()` gives. Columns left-aligned, two spaces apart, trailing blanks trimmed."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """The rows under their headers, each column as wide as its widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*r).rstrip() for r in [headers, *rows])
