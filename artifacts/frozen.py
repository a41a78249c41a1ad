"""The one pydantic base of prebake's data read from disk, the wire or the command line:
frozen (no mutation after validation) and strict about its fields (an unknown one is an error
that names it, not a value silently dropped)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
