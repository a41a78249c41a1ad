"""Where the store lives and how large it may grow: $PREBAKE_HOME and the store's bounds.

    default_home()          $PREBAKE_HOME made absolute, else ~/.cache/prebake
    StoreLimits.from_env()  PREBAKE_STORE_MAX_BYTES (else DEFAULT_MAX_BYTES), PREBAKE_UNPACK_MAX_BYTES
    parse_size("10G")       the sizes operators write, in bytes

The registry address is not a store setting: engine/compose.py decides it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from prebake.artifacts.bundle.payload import UnpackLimits
from prebake.artifacts.errors import StoreError

HOME_ENV = "PREBAKE_HOME"
MAX_BYTES_ENV = "PREBAKE_STORE_MAX_BYTES"
UNPACK_MAX_BYTES_ENV = "PREBAKE_UNPACK_MAX_BYTES"
DEFAULT_MAX_BYTES = 10 * 1024**3  # the store's bound when PREBAKE_STORE_MAX_BYTES is not set (sccache's 10 GiB)


def default_home(env: Mapping[str, str] = os.environ) -> Path:
    """$PREBAKE_HOME (made absolute: a relative one would move with the working folder), else ~/.cache/prebake."""
    return absolute(env.get(HOME_ENV) or Path.home() / ".cache" / "prebake")


def absolute(path: Path | str) -> Path:
    """`path` with ~ expanded, made absolute against the working folder and normalised (no `..`);
    links are kept, so the path stays the one the operator named."""
    return Path(os.path.abspath(Path(path).expanduser()))


def parse_size(text: str, what: str = "size") -> int:
    """Bytes from '5000000', '10M', '2G', '1.5GiB': K, M, G and T are powers of 1024."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not match:
        raise StoreError(f"{what} {text!r} is not a size; write bytes or a number with K, M, G or T, e.g. 10G")
    return int(float(match[1]) * 1024 ** " KMGT".index(match[2].upper() or " "))


@dataclass(frozen=True)
class StoreLimits:
    """How large the store may grow (None: unbounded, for tests and tools) and how far one archive may
    unpack. From the environment it is always bounded: PREBAKE_STORE_MAX_BYTES, else DEFAULT_MAX_BYTES."""

    max_bytes: int | None = None
    unpack: UnpackLimits = UnpackLimits()

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> StoreLimits:
        raw_max, raw_unpack = env.get(MAX_BYTES_ENV), env.get(UNPACK_MAX_BYTES_ENV)
        unpack_limits = (
            UnpackLimits(max_bytes=parse_size(raw_unpack, UNPACK_MAX_BYTES_ENV)) if raw_unpack else UnpackLimits()
        )
        return cls(parse_size(raw_max, MAX_BYTES_ENV) if raw_max else DEFAULT_MAX_BYTES, unpack_limits)
