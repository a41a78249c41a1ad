"""`prebake serve --tp 2` end to end: one package for both ranks, the same answers as tp=1, the
same road on every rank, a dead rank ending the server, and a tp miss named.

The session bakes tp-test (4 heads, 2 KV heads, fp32, three step shapes, tp = [1, 2]) once through
`doit bake`, which builds both targets; every test serves from that registry (or a copy of it
without the tp=2 bundles).
Rank-death and bf16 tests serve eager (no compile), so they cost a start, not a bake.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.support.baking import Home
from tests.support.serving import ServeProcess, metric, serve_env, write_recipe

pytestmark = pytest.mark.slow

MODEL = "tp-test"
PROMPTS = ([5, 17, 300, 42, 7], [1, 2, 3, 400, 11, 12, 13, 14, 15])  # two at once: decode at batch 2 too


def _recipe(folder: Path, dtype: str = "fp32") -> None:
    write_recipe(folder, MODEL, variant="aoti-package", seqs=2, dtype=dtype)
    path = folder / f"{MODEL}.toml"
    path.write_text(path.read_text().replace('platform = ["cpu"]', 'platform = ["cpu"]\ntp = [1, 2]'))


@pytest.fixture(scope="session")
def recipes(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tp-recipes")
    _recipe(folder)
    return folder


@pytest.fixture(scope="session")
def registries(tmp_path_factory, recipes) -> dict[int, Path]:
    """{2: the registry one `doit bake` of the recipe (tp = [1, 2]) filled, 1: a copy without its tp=2 bundles}."""
    root = tmp_path_factory.mktemp("tp-bake")
    both, one = root / "registry", root / "registry-tp1"
    env = {"PREBAKE_RECIPES": str(recipes)}
    done = Home(root / "baker").doit(
        "run", "bake", f"model={MODEL}", "precision=fp32", f"registry={both}", extra_env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tp-test/cpu/tp1/fp32 graphs: published" in done.stdout + done.stderr
    assert "tp-test/cpu/tp2/fp32 graphs: published" in done.stdout + done.stderr
    shutil.copytree(both, one)
    for entry in (one / "index").rglob("*.json"):
        if json.loads(entry.read_text())["key"].get("parallel", {}).get("tp") in (2, "2"):
            entry.unlink()
    return {1: one, 2: both}


def _server(tmp_path_factory, recipes, registry, *args: str, **env: str) -> ServeProcess:
    home = tmp_path_factory.mktemp("tp-home")
    return ServeProcess(["--model", MODEL, "--registry", str(registry), *args], serve_env(home, recipes, **env))


def _answers(server: ServeProcess, margins: dict[int, list[float]] | None = None) -> list[list[int]]:
    """Greedy tokens of PROMPTS, sent at once (prefill b1, decode b1 and b2); `margins`: filled with
    each token's lead over the runner-up (log-probabilities)."""
    results: dict[int, list[int]] = {}

    def ask(i: int) -> None:
        body = server.complete(prompt=PROMPTS[i], max_tokens=12, temperature=0, logprobs=2)
        results[i] = body["choices"][0]["token_ids"]
        if margins is not None:
            tops = [sorted(top.values(), reverse=True) for top in body["choices"][0]["logprobs"]["top_logprobs"]]
            margins[i] = [t[0] - t[1] if len(t) > 1 else float("inf") for t in tops]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return [results[i] for i in range(len(PROMPTS))]


@pytest.fixture(scope="session")
def served(tmp_path_factory, recipes, registries):
    """tp=1's answers and a ready tp=2 server, both from the bake's packages."""
    one = _server(tmp_path_factory, recipes, registries[2], "--tp", "1")
    try:
        one.wait_ready()
        tp1 = _answers(one)
    finally:
        one.stop()
    two = _server(tmp_path_factory, recipes, registries[2], "--tp", "2", "--on-miss", "fail")
    two.wait_ready()
    two.wait_line("[rank 1] prebake serve: rank 1 ready")  # rank 1's lines come on its own clock
    yield tp1, two
    two.stop()


def test_two_ranks_serve_tp1s_greedy_tokens_from_the_baked_package(served):
    tp1, two = served
    assert _answers(two) == tp1
    assert "compile" not in re.findall(r"prebake serve: (\w[\w-]*):", two.log)  # nothing compiled in place


def test_every_rank_loads_one_package_file_byte_for_byte(served, registries):
    _, two = served
    loaded = re.findall(
        r"(?:\[rank (\d)\] )?prebake serve:\s+aoti-package: rank (\d) of 2 loaded (\S+) \(sha256 (\w+)\)", two.log
    )
    assert sorted(r for _, r, _, _ in loaded) == ["0", "1"], two.log
    paths, digests = {p for _, _, p, _ in loaded}, {d for _, _, _, d in loaded}
    assert len(paths) == 1 and len(digests) == 1  # one file, the same bytes
    assert hashlib.sha256(Path(paths.pop()).read_bytes()).hexdigest() == digests.pop()


def test_the_tp2_graphs_bundle_holds_one_package_compiled_for_tp2(served):
    _, two = served
    tree = Path(re.search(r"read in place from (\S+)", two.log).group(1))
    assert [p.name for p in tree.rglob("*.pt2")] == ["steps.pt2"]
    assert json.loads((tree / "aoti" / "package.json").read_text())["tp"] == 2


def test_a_tp2_start_where_only_tp1_was_baked_is_a_miss_naming_the_tp(tmp_path_factory, recipes, registries):
    server = _server(tmp_path_factory, recipes, registries[1], "--tp", "2", "--on-miss", "fail")
    assert server.wait_exit(300) == 3
    assert "parallel.tp: 2 here, 1 there" in server.log


def test_a_rank_that_cannot_load_the_package_takes_every_rank_to_the_same_fallback(
    tmp_path_factory, recipes, registries
):
    no_avx = tmp_path_factory.mktemp("cpuinfo") / "cpuinfo"
    no_avx.write_text("processor\t: 0\nflags\t\t: fpu sse sse2\n")
    server = _server(tmp_path_factory, recipes, registries[2], "--tp", "2", PREBAKE_TEST_RANK_CPUINFO=f"1:{no_avx}")
    try:
        server.wait_ready()
        server.wait_line("[rank 1] prebake serve: rank 1 ready")  # rank 1's lines come on its own clock
        fell = [
            line for line in server.lines if "aoti-package: rank 1: the AOTInductor package does not load here" in line
        ]
        assert len(fell) == 2, server.log  # said on both ranks: rank 0 takes rank 1's road
        assert all("compiling in place" in line for line in fell)
        assert "[rank 1] prebake serve: compile:" in server.log  # both ranks compiled in place
        assert "prebake.serve: prebake serve: compile:" in server.log
        assert metric(server.get("/metrics")[1], 'prebake_variant_fallbacks_total{variant="aoti-package"}') == 1
    finally:
        server.stop()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_eager_at_tp2_answers_as_eager_at_tp1(tmp_path_factory, dtype):
    folder = tmp_path_factory.mktemp(f"eager-{dtype}")
    _recipe(folder, dtype)
    answers, margins = [], {}
    for tp in ("1", "2"):
        server = _server(tmp_path_factory, folder, tmp_path_factory.mktemp("empty"), "--tp", tp, "--eager")
        try:
            server.wait_ready()
            answers.append(_answers(server, margins if tp == "1" else None))
        finally:
            server.stop()
    if dtype == "fp32":
        assert answers[0] == answers[1]
        return
    # bf16 rounds each rank's partial sum (docs/serving.md): tp 2 picks tp 1's token wherever tp 1's
    # choice is clear, and may part from it only at a near-tie (then the continuations differ)
    for i, (one, two) in enumerate(zip(*answers, strict=True)):
        parted = next((n for n, (a, b) in enumerate(zip(one, two, strict=True)) if a != b), None)
        assert parted is None or margins[i][parted] < 0.1, (i, parted, one, two, margins[i])


def _rank_pids(server: ServeProcess) -> dict[int, int]:
    server._wait(lambda: "tp 2: ranks" in server.log, 120, "to start its ranks")
    listed = re.search(r"tp 2: ranks (.*)", server.log).group(1)
    return {int(r): int(p) for r, p in re.findall(r"(\d) \(pid (\d+)\)", listed)}


def _health_until_gone(server: ServeProcess, within_s: float = 10) -> list[int]:
    """/health's statuses every 0.1 s until the server stops answering."""
    statuses: list[int] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and (not statuses or statuses[-1] != 0):
        statuses.append(server.get("/health")[0])
        time.sleep(0.1)
    return statuses


@pytest.mark.parametrize("when", ["starting", "serving"])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_killed_ends_the_server_naming_it(tmp_path_factory, recipes, rank, when):
    import os

    server = _server(tmp_path_factory, recipes, tmp_path_factory.mktemp("empty"), "--tp", "2", "--eager")
    try:
        pids = _rank_pids(server)
        if when == "serving":
            server.wait_ready()
        killed = time.monotonic()
        os.kill(pids[rank], signal.SIGKILL)
        health = _health_until_gone(server) if rank == 1 and when == "serving" else []
        code = server.wait_exit(30)
        took = time.monotonic() - killed
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code != 0 and took < 10, (code, took, server.log)
    assert f"prebake serve: rank {rank} (pid {pids[rank]}) was killed by SIGKILL; stopping every rank" in server.log
    if health:  # rank 0 still answers for a moment: not ready
        assert 503 in health and 200 not in health[health.index(503) :], health
    for pid in pids.values():  # no rank left behind, none hung in a collective
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_plan_and_fetch_show_the_tp_targets_this_cpu_host_builds(tmp_path_factory, recipes, registries):
    home = Home(tmp_path_factory.mktemp("tp-plan"))
    env = {"PREBAKE_RECIPES": str(recipes)}
    plan = home.prebake("plan", "--model", MODEL, "--registry", str(registries[1]), extra_env=env)
    assert plan.returncode == 0, plan.stderr
    rows = {line.split()[0]: line.split() for line in plan.stdout.splitlines() if line.startswith(f"{MODEL}/")}
    assert rows[f"{MODEL}/cpu/tp1/fp32"][1] == "present" and rows[f"{MODEL}/cpu/tp2/fp32"][1] == "missing"
    assert rows[f"{MODEL}/cpu/tp2/fp32"][-1] == "yes"  # built here: N rank processes on this CPU
    fetched = home.prebake(
        "fetch", "--model", MODEL, "--tp", "2", "--registry", str(registries[2]), "--json", extra_env=env
    )
    assert fetched.returncode == 0, fetched.stderr
    tree = Path(json.loads(fetched.stdout)["bundles"]["graphs"]["tree"])
    assert json.loads((tree / "aoti" / "package.json").read_text())["tp"] == 2
