"""`prebake serve --tp N`: N rank processes, rank 0 serving HTTP, every rank running each step.

    supervisor   the `prebake serve` process: binds the port, starts ranks 0..N-1 (this same
                 command again, PREBAKE_TP_RANK naming the rank, the group's port and the
                 inherited fds), then watches them; the first rank to exit ends the others within
                 seconds (SIGTERM, then SIGKILL) and the server, with a line naming the rank
    rank r       joins the gloo group on 127.0.0.1 (runtime/lockstep.py), starts the engine on
                 its shard; rank 0 serves HTTP on the inherited socket and broadcasts each step's
                 inputs (`Lockstep`), ranks 1.. run every step it broadcasts (`follow`)

No torchrun: the supervisor imports no torch, so it stays light and outlives any rank.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prebake.engine.common.ports import loopback_port

if TYPE_CHECKING:
    from prebake.artifacts.recipe.kinds import TargetKeys

RANK_ENV = "PREBAKE_TP_RANK"
RANK_DIED = 70  # the server's exit status when a rank ended it (sysexits' EX_SOFTWARE)
_GRACE_S = 1.5  # after a rank dies: rank 0's /health says 503 this long before every rank is told to stop
_STOP_S = 3.0  # then SIGTERM, and SIGKILL for a rank still there this long after


@dataclass(frozen=True)
class RankContext:
    """What a rank process was started with: its rank, the group's size and port, inherited fds."""

    rank: int
    world: int
    port: int
    listen_fd: int = -1  # rank 0: the supervisor's listening socket
    notice_fd: int = -1  # rank 0: a pipe on which the supervisor writes why the server is stopping

    def encode(self) -> str:
        return f"{self.rank},{self.world},{self.port},{self.listen_fd},{self.notice_fd}"

    @classmethod
    def from_environ(cls, environ=os.environ) -> RankContext | None:
        text = environ.get(RANK_ENV)
        if not text:
            return None
        try:
            rank, world, port, listen_fd, notice_fd = (int(p) for p in text.split(","))
            return cls(rank, world, port, listen_fd, notice_fd)
        except ValueError:
            raise ValueError(
                f"{RANK_ENV}={text!r} is not rank,world,port,listen_fd,notice_fd; it is set by "
                f"`prebake serve --tp N` for its ranks, never by hand: unset it"
            ) from None


def check_ranks(plan: TargetKeys, eager: bool, rank: RankContext | None) -> None:
    """A tp=N target runs on N ranks (`prebake serve --tp N`), in a variant that serves at tp N;
    else UsageError saying how to serve it."""
    from prebake.artifacts.errors import UsageError
    from prebake.engine.bundled.variants import variant_of

    world = 1 if rank is None else rank.world
    if plan.target.tp != world:
        raise UsageError(
            f"{plan.target.name} is a tp {plan.target.tp} target and this process is {world} rank(s); "
            f"serve it with `prebake serve --tp {plan.target.tp}`"
        )
    if not eager and (why := variant_of(plan.recipe).refuses(plan.target)):
        raise UsageError(f"{plan.target.name}: {why}")


def supervise(world: int, sock: socket.socket, emit: Callable[[str], None]) -> int:
    """Start `world` ranks of this command and watch them; the server's exit status."""
    port = loopback_port()
    notice_read, notice_write = os.pipe()
    ranks: list[subprocess.Popen] = []
    for rank in range(world):
        context = RankContext(rank, world, port, *((sock.fileno(), notice_read) if rank == 0 else (-1, -1)))
        fds = (sock.fileno(), notice_read) if rank == 0 else ()
        env = {**os.environ, RANK_ENV: context.encode()}
        ranks.append(subprocess.Popen([sys.executable, *sys.orig_argv[1:]], env=env, pass_fds=fds))
    os.close(notice_read)
    sock.close()  # rank 0 holds it now
    emit(f"prebake serve: tp {world}: ranks {', '.join(f'{r} (pid {p.pid})' for r, p in enumerate(ranks))}")
    stopping = _Stopping()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping.handle)
    try:
        return _watch(ranks, notice_write, stopping, emit)
    finally:
        _end(ranks)
        os.close(notice_write)


class _Stopping:
    signum: int | None = None

    def handle(self, signum, frame) -> None:
        self.signum = signum


def _watch(ranks: list[subprocess.Popen], notice: int, stopping: _Stopping, emit: Callable[[str], None]) -> int:
    while True:
        if stopping.signum is not None:  # asked to stop: every rank stops as one process would
            for proc in ranks:
                _signal(proc, signal.SIGTERM)
            codes = [_wait(proc, _STOP_S) for proc in ranks]
            return 128 + stopping.signum if codes[0] in (0, 128 + stopping.signum) else RANK_DIED
        for rank, proc in enumerate(ranks):
            code = proc.poll()
            if code is None:
                continue
            if rank == 0 and code == 0 and all(p.poll() is not None for p in ranks):
                return 0
            why = f"rank {rank} (pid {proc.pid}) {_how(code)}"
            emit(f"prebake serve: {why}; stopping every rank (tp {len(ranks)})")
            _tell(notice, why)
            deadline = time.monotonic() + _GRACE_S
            while time.monotonic() < deadline and ranks[0].poll() is None:
                time.sleep(0.05)
            _end(ranks)
            return code if code > 0 else RANK_DIED  # a rank's own status (3: --on-miss fail) passes through
        time.sleep(0.05)


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _tell(fd: int, line: str) -> None:
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:  # rank 0 is gone already
        pass


def _end(ranks: list[subprocess.Popen]) -> None:
    for proc in ranks:
        _signal(proc, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_S
    for proc in ranks:
        if _wait(proc, max(0.0, deadline - time.monotonic())) is None:
            _signal(proc, signal.SIGKILL)
            proc.wait()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def read_notices(fd: int, on_notice: Callable[[str], None]) -> None:
    """Rank 0's thread: each line the supervisor writes (why the server stops) to `on_notice`."""
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        for line in iter(pipe.readline, b""):
            on_notice(line.decode(errors="replace").strip())
