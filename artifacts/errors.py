"""Every error prebake raises on purpose, rooted in one base.

Each message names what failed (the file, key or path) and what to do next, so a
user can act on it without reading the code.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit status of every prebake command and engine: one table, kept by all."""

    OK = 0  # done: installed, served, verified
    FAILED = 1  # something went wrong that is not bad input (a bad entry found by verify, a failed bake)
    INVALID = 2  # bad input or refused content: unknown model, malformed recipe, bad registry address
    MISS = 3  # nothing matches: bundles missed and the caller asked not to compile (fetch, --on-miss fail)
    UNAVAILABLE = 4  # the registry could not be asked: down, refusing us (credentials), or out of time
    STORE = 5  # the local store ($PREBAKE_HOME) cannot be used: not a folder, not writable, full


class PrebakeError(Exception):
    """Base of every error prebake raises on purpose."""


class UsageError(PrebakeError, ValueError):
    """A command-line option or doit variable is unknown or malformed (a typo, a word for a number)."""


class MissingExtraError(PrebakeError, ImportError):
    """A feature needs a package of an optional extra that is not installed (prebake.artifacts.extras)."""


class RecipeError(PrebakeError, ValueError):
    """A recipe file is missing, malformed, or asks for limits that cannot work together."""


class UnknownModelError(RecipeError, LookupError):
    """No recipe of that name exists."""


class HostCannotBuildError(PrebakeError, RuntimeError):
    """The recipe's targets need hardware or a precision this host does not have."""


class BucketError(PrebakeError, ValueError):
    """Bucket settings are inconsistent, or a request fits no bucket."""


class BundleError(PrebakeError, ValueError):
    """A bundle's manifest or payload is malformed, or its digest does not match."""


class UnsafeArchiveError(BundleError):
    """An archive holds an entry that would land outside its folder, or is too large to unpack."""


class StoreError(PrebakeError, OSError):
    """The local store could not be read or written."""


class StoreBoundError(StoreError):
    """The store's bound cannot hold the bundles one start needs at once."""


class StoreOverlapError(StoreError, ValueError):
    """A folder registry and the store share a folder (the same, or one inside the other)."""


class BuildError(PrebakeError, RuntimeError):
    """Building an artifact (autotune, graph compilation) failed."""
