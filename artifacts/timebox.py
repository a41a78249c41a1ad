"""One helper for one recurring shape: run a call for at most N seconds, get a typed outcome back.

    within(5.0, lambda: registry.lookup(kind, digest))  ->  Done(value) | Raised(error) | TimedOut(5.0)

The call runs in a daemon thread; one that outlives its box is abandoned, never waited on (a
registry that hangs must not hold a start-up), and its late result is dropped. A box can be
handed down as a deadline (a time.monotonic() value): `bounded(check, deadline)` is a
`Boundable` check (the trust policy's own reads) ending its reads by the caller's deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


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
    return slot[0] if slot else TimedOut(seconds)


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
