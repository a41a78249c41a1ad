"""Ranks in lockstep: the gloo group, what every rank agrees on before a step, and the steps.

    join(rank, world, port)   the default process group (gloo over 127.0.0.1), named as the
                              package's collectives name it
    agree(...), from_rank0    every rank's answer to one question (did the package load?), or
                              rank 0's decision (which step shapes and tactics): one road for all
    Lockstep                  rank 0's steps: each step's inputs broadcast, then run here
    follow(steps)             ranks 1..: run every step rank 0 broadcasts, until it says stop

A step's collectives (the all-reduces inside the model) then line up on every rank. A rank
waiting for the next step is kept inside the group's timeout by a heartbeat from rank 0. Every
collective issued from Python keeps its work alive here a while (`_Held`: why, there).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from prebake.artifacts.errors import StoreError
from prebake.engine.bundled.runtime.model import ATTN_IMPLS
from prebake.engine.bundled.runtime.parallel import Parallel, world_group_name
from prebake.engine.bundled.runtime.steps import CompiledSteps, Tactic

GROUP_TIMEOUT = timedelta(minutes=30)  # a collective waits this long for a live peer (torch's default)
HEARTBEAT_S = 10.0  # rank 0 says "no step" this often while idle, so followers never time out
_STOP, _PREFILL, _DECODE, _IDLE = 0, 1, 2, 3
T = TypeVar("T")


def join(rank: int, world: int, port: int, timeout: timedelta = GROUP_TIMEOUT) -> Parallel:
    """This process as rank `rank` of `world`, over gloo on 127.0.0.1:port (rank 0 hosts the store)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout)
    return Parallel(rank, world, world_group_name())


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class _Held:
    """The works of the last few rounds of collectives issued from Python, kept alive on purpose.

    A gloo work holds its tensors; a tensor made in Python gives its Python object back (a decref,
    under the GIL) when the last C++ reference goes. When gloo's worker thread drops that last
    reference, it does so holding the group's queue mutex and waits for the GIL; an AOTInductor
    package's all-reduce, called on a Python thread that keeps the GIL while the package runs, waits
    for that mutex: both ranks hang (seen here with py-spy, torch 2.13 gloo: rank 1 in
    `ProcessGroupGloo::enqueue`, gloo's thread in `~AsyncWork` -> `gil_scoped_acquire`). Kept here
    until dozens of collectives later, a work's last reference goes on a Python thread instead,
    long after gloo's worker let go of it."""

    def __init__(self, works: int = 64) -> None:
        self._works: deque[dist.Work] = deque(maxlen=works)

    def run(self, work: dist.Work | None) -> None:
        """Wait for `work` (the GIL released meanwhile), then keep it while the next ones run."""
        assert work is not None  # async_op=True always returns one
        work.wait()
        self._works.append(work)


_HELD = _Held()


def _broadcast(*tensors: torch.Tensor) -> None:
    for tensor in tensors:  # one at a time, in the same order on every rank
        _HELD.run(dist.broadcast(tensor, src=0, async_op=True))


def _gather(parallel: Parallel, value: object) -> list:
    """Every rank's `value` (pickled), in rank order: torch's all_gather_object, with its works held."""
    mine = torch.frombuffer(bytearray(pickle.dumps(value)), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(parallel.world)]
    _HELD.run(dist.all_gather(sizes, torch.tensor([mine.numel()]), async_op=True))
    longest = max(int(size.item()) for size in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: mine.numel()] = mine
    rows = [torch.zeros(longest, dtype=torch.uint8) for _ in range(parallel.world)]
    _HELD.run(dist.all_gather(rows, padded, async_op=True))
    return [pickle.loads(row[: int(size.item())].numpy().tobytes()) for row, size in zip(rows, sizes)]


def agree(parallel: Parallel | None, answer: str | None) -> list[str | None]:
    """Every rank's `answer` (None: yes; else why not), in rank order; [answer] at tp=1."""
    if parallel is None or parallel.world == 1:
        return [answer]
    return _gather(parallel, answer)


def from_rank0(parallel: Parallel, value: T) -> T:
    """Rank 0's `value` on every rank (what rank 0 decided: the schedule of step shapes and tactics)."""
    return _gather(parallel, value if parallel.rank == 0 else None)[0]


def first_refusal(answers: list[str | None]) -> str | None:
    """The first rank's reason, naming the rank ("rank 1: ..."), or None when every rank said yes."""
    return next((f"rank {r}: {a}" for r, a in enumerate(answers) if a is not None), None)


def agree_on_schedule(parallel: Parallel | None, schedule: dict, note: Callable[[str], None]) -> None:
    """Every rank runs rank 0's step shapes with rank 0's tactics: only then do their steps'
    collectives line up. The shapes follow from the buckets; the tactics differ where each rank
    autotuned in place (a cold start), and rank 0's win (its autotune is the one written back)."""
    if parallel is None or parallel.world == 1:
        return
    first = from_rank0(parallel, list(schedule.items()))
    if [shape for shape, _ in first] != list(schedule):
        raise StoreError(
            f"rank {parallel.rank} would run other step shapes than rank 0 ({', '.join(s.name for s, _ in first)}): "
            f"the ranks started from different buckets bundles; clear the store and start again"
        )
    if any(schedule[shape] != tactic for shape, tactic in first):
        note(f"rank {parallel.rank} runs rank 0's tactics (each rank autotuned in place)")
    schedule.update(first)


def agreement(parallel: Parallel | None, note: Callable[[str], None]) -> Callable[[str | None], str | None] | None:
    """At tp > 1, the warm-up's agreement after each variant's load: every rank's answer (None: it
    loaded), the first rank's reason when any could not (the same road for all: a package that loads on
    rank 0 but not rank 1 is a fallback on both); each rank logs the package file it loaded."""
    if parallel is None or parallel.world == 1:
        return None

    def agreed(reason: str | None) -> str | None:
        refusal = first_refusal(agree(parallel, reason))
        if refusal is None:
            note(f"rank {parallel.rank} of {parallel.world}: loaded; every rank did")
        return refusal

    return agreed


class Lockstep(CompiledSteps):
    """Rank 0's steps: every prefill/decode is broadcast to the other ranks, then run here."""

    def __init__(self, steps: CompiledSteps, heartbeat_s: float = HEARTBEAT_S) -> None:
        super().__init__(steps.model, steps.cache, compile=False)
        self.steps = steps
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._closed = threading.Event()
        self._beat = threading.Thread(
            target=self._heartbeat, args=(heartbeat_s,), name="prebake-heartbeat", daemon=True
        )
        self._beat.start()

    def prefill(self, ids, lengths, slots, tactic: Tactic):
        with self._lock:
            _send(_PREFILL, ids.shape[1], 0, tactic, ids, lengths, slots)
            self._last = time.monotonic()
            return self.steps.prefill(ids, lengths, slots, tactic)

    def decode(self, ids, positions, slots, ctx_len: int, tactic: Tactic):
        with self._lock:
            _send(_DECODE, 1, ctx_len, tactic, ids, positions, slots)
            self._last = time.monotonic()
            return self.steps.decode(ids, positions, slots, ctx_len, tactic)

    def close(self) -> None:
        """Tell the followers to stop (they return from `follow`), unless the group is lost."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            _send(_STOP, 0, 0, Tactic())

    def abandon(self) -> None:
        """A rank is gone: no collective again (one would wait for it), not even the stop."""
        self._closed.set()

    def _heartbeat(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            with self._lock:
                if time.monotonic() - self._last >= every_s and not self._closed.is_set():
                    _send(_IDLE, 0, 0, Tactic())
                    self._last = time.monotonic()


def _send(op: int, tokens: int, ctx_len: int, tactic: Tactic, *rows: torch.Tensor) -> None:
    batch = rows[0].shape[0] if rows else 0
    _broadcast(torch.tensor([op, batch, tokens, ctx_len, ATTN_IMPLS.index(tactic.attn_impl)]))
    _broadcast(*(row.contiguous() for row in rows))


def follow(steps: CompiledSteps) -> None:
    """Run every step rank 0 broadcasts, until it broadcasts stop (or the group fails: raised)."""
    while True:
        header = torch.zeros(5, dtype=torch.long)
        _broadcast(header)
        op, batch, tokens, ctx_len, attn = header.tolist()
        if op == _STOP:
            return
        if op == _IDLE:
            continue
        tactic = Tactic(ATTN_IMPLS[attn])
        ids = torch.zeros((batch, tokens) if op == _PREFILL else (batch,), dtype=torch.long)
        per_row, slots = torch.zeros(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)
        _broadcast(ids, per_row, slots)
        if op == _PREFILL:
            steps.prefill(ids, per_row, slots, tactic)
        else:
            steps.decode(ids, per_row, slots, ctx_len, tactic)
