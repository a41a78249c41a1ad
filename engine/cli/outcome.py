"""What a failed command exits with and says: one table from error to exit code, and its advice.

    0 OK           done
    1 FAILED       checked and found bad entries (verify, store verify), kept a held bundle (store rm), a bake failed
    2 INVALID      bad input or refused content: an unknown model, option or variable, a bad or wrong
                   registry address, a bundle that fails a check
    3 MISS         nothing matches: no usable bundle (fetch, serve --on-miss fail)
    4 UNAVAILABLE  the registry could not be asked: down, refusing us (credentials), out of time
    5 STORE        the local store ($PREBAKE_HOME) cannot be used: a file, read-only for a writer, not creatable
    6 FULL         the store's disk is full: the line says how much was needed and free, and the gc to run

docs/commands.md holds the same table; tests/repo/test_docs_commands.py checks one against the other.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass

from prebake.artifacts.errors import ExitCode, PrebakeError, UsageError
from prebake.artifacts.ports.errors import is_fault
from prebake.artifacts.store.mark import StoreHomeError
from prebake.artifacts.store.settings import HOME_ENV, default_home
from prebake.engine.common.logs import LogSettingError

_STORE_ERRNOS = {errno.ENOTDIR, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EEXIST}


@dataclass(frozen=True)
class Failure:
    """One failed command: its exit code, the error's type and the line it prints."""

    code: ExitCode
    kind: str
    message: str

    def to_json(self) -> str:
        return json.dumps({"error": {"code": int(self.code), "type": self.kind, "message": self.message}}, indent=2)


def failure(exc: BaseException) -> Failure:
    """The exit code and message of an error that ended a command."""
    kind = type(exc).__name__
    text = "\n".join([str(exc), *getattr(exc, "__notes__", ())])
    code = getattr(exc, "code", None)
    if isinstance(code, int) and isinstance(exc, PrebakeError):  # MissRefused carries why it missed
        return Failure(ExitCode(code), kind, text)
    if isinstance(exc, (UsageError, LogSettingError)):
        return Failure(ExitCode.INVALID, kind, text)
    if is_fault(exc):  # RegistryUnavailable: the registry could not be asked
        return Failure(ExitCode.UNAVAILABLE, kind, f"{text}\n{UNAVAILABLE_ADVICE}")
    if isinstance(exc, StoreHomeError):
        return Failure(ExitCode.STORE, kind, text)
    if isinstance(exc, PrebakeError):
        return Failure(ExitCode.INVALID, kind, text)
    if isinstance(exc, OSError):
        if exc.errno in _STORE_ERRNOS and _under_home(exc):
            return Failure(ExitCode.STORE, kind, f"the local store cannot be used: {text} ({_home_line()})")
        return Failure(ExitCode.INVALID, kind, text)
    return Failure(ExitCode.INVALID, kind, f"unexpected {kind}: {text} (a bug in prebake: please report it)")


UNAVAILABLE_ADVICE = (
    "the registry could not be asked: check that it is up and is the one meant, and its credentials (the "
    "error above names the settings its backend reads), or give it longer (--registry-timeout)"
)


def _under_home(exc: BaseException) -> bool:
    home = str(default_home())
    names = [getattr(exc, "filename", None), getattr(exc, "filename2", None)]
    return any(isinstance(n, str) and (n == home or n.startswith(home + "/")) for n in names) or home in str(exc)


def _home_line() -> str:
    return f"{HOME_ENV}={default_home()}: point it at a local, writable folder (default ~/.cache/prebake)"
