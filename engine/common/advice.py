"""What a set of misses means for a command, and the one next step to say: the exit code of
`prebake fetch` and of a start under --on-miss fail, and the advice printed beside the misses
(shared by the CLI and every engine's start, which sit above the fetch pipeline that finds them)."""

from __future__ import annotations

from collections.abc import Iterable

from prebake.artifacts.errors import ExitCode
from prebake.artifacts.fetch.outcome import Miss


def miss_exit_code(misses: Iterable[Miss]) -> ExitCode:
    """What a set of misses means for a command: 6 the store's disk is full, 2 something was refused,
    4 the registry could not be asked, 3 nothing matches (0 when there are none)."""
    misses = list(misses)
    if not misses:
        return ExitCode.OK
    if any(m.full for m in misses):
        return ExitCode.FULL
    if any(m.refused for m in misses):
        return ExitCode.INVALID
    if any(m.unavailable for m in misses):
        return ExitCode.UNAVAILABLE
    return ExitCode.MISS


def bake_command(model: str, precision: str | None = None, tp: int | None = None) -> str:
    """The `doit bake` command line that bakes `model` (narrowed to a precision, a tp size): the
    one spelling of the advice to bake, for every miss and refusal that gives it."""
    given = {"model": model, "precision": precision, "tp": tp}
    return " ".join(["doit bake", *(f"{name}={value}" for name, value in given.items() if value is not None)])


def miss_advice(misses: Iterable[Miss], *, target: str, bake: str, address: str) -> str:
    """The one next step for a set of misses: fix the registry's access, or bake what is missing
    (`bake` is the command that bakes the target: `bake_command`'s)."""
    misses = list(misses)
    code = miss_exit_code(misses)
    if code == ExitCode.FULL:
        return next(m.reason for m in misses if m.full).split("failed: ", 1)[-1].removeprefix("StoreFullError: ")
    if code == ExitCode.UNAVAILABLE:
        return (
            f"registry {address} could not be asked (down, refusing us, or slower than its time box): check "
            f"that it is up and is the one meant, and its credentials (the error above names the settings its "
            f"backend reads), or give it longer with --registry-timeout / --fetch-timeout"
        )
    if code == ExitCode.INVALID:
        return (
            f"registry {address} holds bundles that failed a check (above): run `prebake verify --registry {address}`"
        )
    return f"nothing in {address} matches {target}: bake it ({bake}), or check the address"
