"""`prebake serve` when the registry is empty, unreadable or silent: a miss with its reason, never a crash.

No test here compiles graphs: --on-miss fail stops before compiling, and the fallback that
serves runs with --eager (buckets and autotune built in place, no torch.compile).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from prebake.artifacts.layout import index_relpath
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.common.probe import current_host
from prebake.engine.compose import plans_for
from tests.support.serving import ServeProcess, serve_env, write_recipe

EXIT_MISS = 3  # nothing matches (engine/cli/outcome.py, docs/commands.md#exit-codes)
EXIT_REFUSED = 2  # something was there and failed a check
EXIT_UNAVAILABLE = 4  # the registry could not be asked
KINDS_OF_TINY_LLAMA = ("buckets", "autotune", "graphs")


def test_on_miss_fail_exits_3_on_the_real_recipe_and_explains_every_miss(tmp_path):
    (tmp_path / "registry").mkdir()
    server = ServeProcess(
        ["--model", "tiny-llama", "--precision", "bf16", "--registry", str(tmp_path / "registry"), "--on-miss", "fail"],
        serve_env(tmp_path / "home"),
    )
    assert server.wait_exit() == EXIT_MISS
    for kind in KINDS_OF_TINY_LLAMA:
        assert f"miss: {kind} " in server.log
    assert "--on-miss is fail" in server.log and "Traceback" not in server.log
    assert not any((tmp_path / "home" / "tmp").iterdir())  # its private run folder is gone


def _unreadable_registry(tmp_path: Path) -> Path:
    """A registry folder whose index cannot be read (a file where index/ should be): the address is
    right, the registry cannot answer. (A path that is no folder at all is a wrong address: exit 2.)"""
    registry = tmp_path / "registry"
    registry.mkdir()
    (registry / "index").write_text("a file where the index folder should be")
    return registry


def test_an_unreadable_registry_is_a_miss_with_its_reason(tmp_path):
    registry = _unreadable_registry(tmp_path)
    server = ServeProcess(
        ["--model", "tiny-llama", "--precision", "bf16", "--registry", str(registry), "--on-miss", "fail"],
        serve_env(tmp_path / "home"),
    )
    assert server.wait_exit() == EXIT_UNAVAILABLE
    assert f"failed: RegistryUnavailable: cannot read {registry}/index/buckets/" in server.log
    assert "Traceback" not in server.log


def test_a_registry_that_never_answers_is_a_miss_after_the_time_box(tmp_path):
    with socket.socket() as silent:  # listens, never answers: every request hangs until its own time-out
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        env = serve_env(
            tmp_path / "home",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{silent.getsockname()[1]}",
            AWS_ACCESS_KEY_ID="x",
            AWS_SECRET_ACCESS_KEY="x",
            AWS_DEFAULT_REGION="us-east-1",
        )
        started = time.monotonic()
        server = ServeProcess(
            [
                "--model",
                "tiny-llama",
                "--precision",
                "bf16",
                "--registry",
                "s3://prebake/hangs",
                "--registry-timeout",
                "1",
                "--on-miss",
                "fail",
            ],
            env,
        )
        assert server.wait_exit() == EXIT_UNAVAILABLE, server.log  # its abandoned S3 read: timebox.leave
    assert time.monotonic() - started < 60
    assert "registry s3://prebake/hangs did not answer within 1 s (--registry-timeout)" in server.log


def test_an_index_entry_that_is_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    registry = tmp_path / "registry"
    plan = plans_for(load_recipe("tiny-llama"), current_host(), dtype="bf16")[0]
    for kind in KINDS_OF_TINY_LLAMA:  # reading a FIFO nobody writes would block forever
        entry = registry / index_relpath(kind, plan.key(kind).digest)
        entry.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(entry)
    started = time.monotonic()
    args = ["--model", "tiny-llama", "--precision", "bf16", "--registry", str(registry), "--on-miss", "fail"]
    server = ServeProcess(args, serve_env(tmp_path / "home"))
    assert server.wait_exit() == EXIT_REFUSED
    assert time.monotonic() - started < 60
    assert "is not a regular file (a FIFO, device or folder); remove it" in server.log
    assert "Traceback" not in server.log


def test_an_s3_registry_on_a_closed_port_is_a_miss_not_a_crash(tmp_path):
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = serve_env(
        tmp_path / "home",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="x",
        AWS_DEFAULT_REGION="us-east-1",
    )
    server = ServeProcess(
        [
            "--model",
            "tiny-llama",
            "--precision",
            "bf16",
            "--registry",
            "s3://prebake/team",
            "--registry-timeout",
            "20",
            "--on-miss",
            "fail",
        ],
        env,
    )
    assert server.wait_exit() == EXIT_UNAVAILABLE
    for kind in KINDS_OF_TINY_LLAMA:
        assert f"miss: {kind} " in server.log
    assert "registry s3://prebake/team failed: RegistryUnavailable" in server.log and "Traceback" not in server.log


def test_an_unreachable_registry_still_serves_by_building_in_place(tmp_path):
    recipes = tmp_path / "recipes"
    write_recipe(recipes, "serve-test", variant="dynamo-precompile", seqs=2)
    registry = _unreadable_registry(tmp_path)
    server = ServeProcess(
        ["--model", "serve-test", "--registry", str(registry), "--eager"], serve_env(tmp_path / "home", recipes)
    )
    try:
        server.wait_ready(timeout=300)
        assert "miss: buckets " in server.log and f"cannot read {registry}/index/buckets/" in server.log
        assert "prebake serve: build: built buckets, autotune in place" in server.log
        assert len(server.complete(prompt="hello", max_tokens=4, temperature=0)["choices"][0]["token_ids"]) == 4
    finally:
        assert server.stop() == 128 + 15  # SIGTERM: stopped cleanly, not killed
    assert "prebake serve: stopping" in server.log
