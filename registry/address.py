"""Registry address lists: one text form, read the same everywhere.

    /local/folder                     one registry
    /local/folder,s3://team/prebake   a chain, nearest first (PREBAKE_REGISTRY, --registry)
    /data/a\\,b                        a folder whose name holds a comma: the comma escaped
    --registry A --registry B         on the command line: one address per flag, never split

A list is split at commas that no backslash escapes; `join_addresses` escapes the commas
inside each member, so a list of addresses (repeated --registry flags) round-trips through
one string. A whole address naming a folder that exists is never split, so an existing
folder with a comma in its name keeps working unescaped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

_UNESCAPED_COMMA = re.compile(r"(?<!\\),")


def split_addresses(text: str) -> list[str]:
    """The members of an address list, nearest first, each unescaped and stripped."""
    if "," in text and os.path.isdir(os.path.expanduser(text.replace("\\,", ","))):
        return [text.replace("\\,", ",")]
    return [part.strip().replace("\\,", ",") for part in _UNESCAPED_COMMA.split(text) if part.strip()]


def join_addresses(addresses: Sequence[str]) -> str:
    """One address list naming `addresses` in order (their own commas escaped)."""
    return ",".join(a.replace(",", "\\,") for a in addresses)
