"""One helper for one recurring shape: run a call for at most N seconds, get a typed outcome back.

    within(5.0, lambda: registry.lookup(kind, digest))  ->  Done(value) | Raised(error) | TimedOut(5.0)

The call runs in a daemon thread; a call that outlives its time box is abandoned, never
waited on (a registry that hangs must not hold a start-up), and its late result is dropped.
Nothing is carried across threads in shared dicts: the outcome is a value.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

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


Outcome = Done[T] | Raised | TimedOut


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
