"""One helper for one recurring shape: run a call for at most N seconds, get a typed outcome back.

    within(5.0, lambda: registry.lookup(kind, digest))  ->  Done(value) | Raised(error) | TimedOut(5.0)

The call runs in a daemon thread; one that outlives its box is abandoned, never waited on, and its
late result dropped. `bounded(check, deadline)` hands a box down as a time.monotonic() deadline.
A process must not finalize while such a thread runs: CPython aborts (SIGABRT) when it holds stderr's
lock at shutdown (cpython#86883: botocore logging a retry) or pthread_exit ends it inside C++ (torch's
import). `leave(code)`, the `prebake` command's exit, leaves by os._exit while an abandoned or
`unstoppable` thread is alive, after the atexit handlers and a flush of stdout and stderr, each boxed.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NoReturn, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

EXIT_GRACE_S = 5.0  # for the atexit handlers when a thread nobody can stop is alive; each flush gets 1 s
_unstoppable: list[threading.Thread] = []  # not yet started or alive; pruned as threads are added
_unstoppable_lock = threading.Lock()


@dataclass(frozen=True)
class Done(Generic[T]):
    value: T


@dataclass(frozen=True)
class Raised:
    error: Exception

    def describe(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@dataclass(frozen=True)
class TimedOut:
    seconds: float


def within(seconds: float, work: Callable[[], T], *, name: str = "prebake-timebox") -> Done[T] | Raised | TimedOut:
    """`work()`'s outcome if it finishes within `seconds`, else TimedOut."""
    if seconds <= 0:
        return TimedOut(seconds)
    slot: list[Done[T] | Raised] = []

    def run() -> None:
        try:
            slot.append(Done(work()))
        except Exception as exc:  # the outcome carries it; the caller decides what a fault means
            slot.append(Raised(exc))

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(seconds)
    if slot:
        return slot[0]
    unstoppable(worker)
    return TimedOut(seconds)


def unstoppable(thread: threading.Thread) -> threading.Thread:
    """Mark a daemon thread whose work cannot be stopped: while it is alive, `leave` skips finalization."""
    with _unstoppable_lock:
        _unstoppable[:] = [t for t in _unstoppable if t.ident is None or t.is_alive()]
        _unstoppable.append(thread)
    return thread


def leave(code: int) -> NoReturn:
    """End the process with `code`: the interpreter's own exit, or os._exit while an unstoppable thread runs."""
    with _unstoppable_lock:
        running = any(thread.is_alive() for thread in _unstoppable)
    if not running:
        sys.exit(code)
    main = threading.main_thread()
    for thread in threading.enumerate():  # what the interpreter's exit waits for, it waits for here
        if not thread.daemon and thread is not main and thread is not threading.current_thread():
            thread.join()
    within(EXIT_GRACE_S, atexit._run_exitfuncs, name="prebake-exit")
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            within(1.0, stream.flush, name="prebake-exit-flush")
    os._exit(code)


@runtime_checkable
class Boundable(Protocol):
    """Something that reads a remote when called and can be told its caller's deadline."""

    def by(self, deadline: float) -> Boundable:
        """The same, ending every read by `deadline` (a time.monotonic() value)."""
        ...


B = TypeVar("B")


def bounded(thing: B, deadline: float) -> B:
    """`thing` bound to `deadline` when it is Boundable, else `thing` itself."""
    return thing.by(deadline) if isinstance(thing, Boundable) else thing  # type: ignore[return-value]


def seconds_left(deadline: float | None, cap: float) -> float:
    """How long a read may take: `cap`, or what is left before `deadline` when that comes first."""
    return cap if deadline is None else min(cap, deadline - time.monotonic())
