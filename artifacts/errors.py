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
    STORE = 5  # the local store ($PREBAKE_HOME) cannot be used: not a folder, not writable
    FULL = 6  # the store's disk is full: free space (prebake store gc --max-size) and run the same command again


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


class CheckpointError(PrebakeError, ValueError):
    """A model's files cannot serve its recipe: a config.json or safetensors file missing, cut short,
    unreadable, or not the model the recipe describes. The user's file, never a bug in prebake: the
    message names the file or field, what was expected and what was found, and the fix."""


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


class InstallElsewhereError(StoreError):
    """Another process held the blob's install lock when the caller stopped waiting for it: that
    process makes the store's entry."""


class StoreFullError(StoreError):
    """The store's disk has no room for an install: nothing of it was left behind (exit 6)."""

    code = ExitCode.FULL


class StoreReadOnlyError(StoreError):
    """The store is read-only (a read-only mount): it serves what it holds and installs nothing (exit 5)."""

    code = ExitCode.STORE


class StoreSharedError(StoreError):
    """The store is on a network filesystem whose locks may not hold across its nodes (exit 5)."""

    code = ExitCode.STORE


class StoreBoundError(StoreError):
    """The store's bound cannot hold the bundles one start needs at once."""


class StoreOverlapError(StoreError, ValueError):
    """A folder registry and the store share a folder (the same, or one inside the other)."""


class BuildError(PrebakeError, RuntimeError):
    """Building an artifact (autotune, graph compilation) failed."""
