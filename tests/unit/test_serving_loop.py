"""The bundled engine's serving loop runs on the thread that started the engine (engine/bundled/serve.py):
libgomp keeps a thread pool per thread that opens parallel regions, and a second pool (the warm-up's
thread and a scheduler thread of its own) made every OpenMP wait a sleep: tiny-llama's package
decoded at 9.4 ms a step instead of 1.6 ms, two threads on two cores (docs/performance.md)."""

from __future__ import annotations

import threading

from prebake.engine.bundled import serve
from prebake.engine.bundled.api.state import AppState
from prebake.engine.bundled.runtime.metrics import Metrics


class _Loop:
    def __init__(self, fails: bool = False):
        self.fails, self.threads = fails, []

    def serve_forever(self, stop: threading.Event) -> None:
        self.threads.append(threading.get_ident())
        if self.fails:
            stop.set()  # as a signal would, once the loop has stopped
            raise RuntimeError("a bug in a step")


def test_the_loop_runs_on_the_calling_thread_the_one_that_warmed_the_steps_up():
    loop, stop, said = _Loop(), threading.Event(), []
    state = AppState("m", Metrics())
    serve._serve_steps(loop, state, stop, said.append)
    assert loop.threads == [threading.get_ident()] and state.alive() and said == []


def test_a_loop_that_dies_of_a_bug_leaves_the_server_up_and_not_alive():
    loop, stop, said = _Loop(fails=True), threading.Event(), []
    state = AppState("m", Metrics())
    serve._serve_steps(loop, state, stop, said.append)
    assert not state.alive() and said == ["prebake serve: the serving loop stopped: RuntimeError('a bug in a step')"]
