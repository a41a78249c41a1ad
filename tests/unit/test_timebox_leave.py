"""The `prebake` command's exit while a thread nobody can stop is still running (timebox.leave).

Each case runs in a child process: `leave` ends the process it runs in."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# stderr whose write never returns (a reader that stopped reading), taken by a time-boxed call that
# the box then abandons: the thread holds stderr's lock for good, as botocore's retry log did.
WEDGED = textwrap.dedent(
    """
    import atexit, io, sys, time
    from prebake.artifacts.timebox import leave, within

    class NeverReturns(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            time.sleep(3600)
            return len(data)

    sys.stderr = io.TextIOWrapper(io.BufferedWriter(NeverReturns()), line_buffering=True)
    atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
    print("box:", type(within(0.2, lambda: print("late", file=sys.stderr))).__name__)
    """
)


def _run(body: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=timeout)


def test_an_abandoned_thread_wedged_in_a_write_does_not_hold_the_exit_and_the_code_is_kept():
    # sys.exit(4) here ends in SIGABRT (-6): "Fatal Python error: _enter_buffered_busy: could not acquire
    # lock for <_io.BufferedWriter> at interpreter shutdown", CI's flake of test_serve_faults on 12-06
    done = _run(WEDGED + "leave(4)\n")
    assert done.returncode == 4
    assert done.stdout.splitlines() == ["box: TimedOut", "atexit ran"]  # flushed, though a pipe buffers it


def test_with_no_such_thread_alive_the_exit_is_the_interpreters_own():
    body = textwrap.dedent(
        """
        import atexit, weakref
        from prebake.artifacts.timebox import leave, within

        class Finalized:
            def __del__(self):
                print("finalized")

        kept = Finalized()  # collected only by the interpreter's own exit
        atexit.register(lambda: print("atexit ran"))
        print("box:", type(within(5, lambda: 1)).__name__)
        leave(3)
        """
    )
    done = _run(body)
    assert done.returncode == 3
    assert done.stdout.splitlines() == ["box: Done", "atexit ran", "finalized"]


def test_an_unstoppable_thread_still_running_skips_finalization_after_the_exit_handlers():
    body = textwrap.dedent(
        """
        import atexit, threading, time
        from prebake.artifacts.timebox import leave, unstoppable

        class Finalized:
            def __del__(self):
                print("finalized")

        kept = Finalized()
        atexit.register(lambda: print("atexit ran"))
        unstoppable(threading.Thread(target=time.sleep, args=(3600,), daemon=True)).start()
        leave(5)
        """
    )
    done = _run(body)
    assert done.returncode == 5
    assert done.stdout.splitlines() == ["atexit ran"]
