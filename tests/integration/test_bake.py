"""The bake pipeline end to end: real doit, real compiles (AOTInductor, the default), real bundles, real fetch."""

import json
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from prebake.engine.bundled.cache_layout import torch_machine_folder_name
from prebake.engine.bundled.runtime.isa_probes import SETS_DIR
from tests.support.baking import BIN, REPO, Home


def serving_one_short_sequence(folder: Path) -> Path:
    """tiny-llama's shipped recipe with its serving limits cut to one sequence of 64 tokens: the same
    model, autotune and matrix, two step shapes (prefill and decode) instead of seven. What these
    tests check is the pipeline (every kind published, fetched, served, copied), not the bucket set,
    and each shape is about 20 s of compiling on two cores (tests/README.md)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (REPO / "recipes" / "tiny-llama.toml").read_text()
    cut = text.replace("max_model_len = 128\nmax_num_seqs = 2\nmax_num_batched_tokens = 128\n",
                       "max_model_len = 64\nmax_num_seqs = 1\nmax_num_batched_tokens = 64\n")  # fmt: skip
    assert cut != text, "recipes/tiny-llama.toml's [serving] changed: update this copy"
    (folder / "tiny-llama.toml").write_text(cut)
    return folder


@pytest.fixture(scope="session")
def baked(tmp_path_factory) -> Home:
    """tiny-llama (one short sequence: two step shapes) baked once (bf16) into a private home's embedded
    registry; its output in bake.log, its temporary folder (TMPDIR) systemp/, both beside the home."""
    root = tmp_path_factory.mktemp("bake")
    home = Home(root, recipes=serving_one_short_sequence(root / "recipes"))
    seeded_temp(root / "systemp")
    proc = home.doit("run", "bake", "model=tiny-llama", "precision=bf16", extra_env={"TMPDIR": str(root / "systemp")})
    (root / "bake.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return home


@pytest.mark.slow
def test_bake_publishes_every_kind_and_fetch_installs_them(baked):
    listing = baked.prebake("ls")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()[1:]]
    assert sorted(r[1] for r in rows) == ["autotune", "buckets", "graphs"]
    assert all(r[0] == "tiny-llama" and r[3] == "bf16" for r in rows)

    fetched = baked.prebake("fetch", "--model", "tiny-llama", "--precision", "bf16", "--json")
    assert fetched.returncode == 0, fetched.stderr
    env = json.loads(fetched.stdout)["env"]
    buckets = json.loads(open(env["PREBAKE_BUCKETS_FILE"]).read())
    autotune = json.loads(open(env["PREBAKE_AUTOTUNE_FILE"]).read())
    graphs = json.loads(open(f"{env['PREBAKE_GRAPHS_DIR']}/graphs.json").read())
    assert buckets["prompt"] and buckets["decode"]
    assert {json.dumps(r["shape"], sort_keys=True) for r in autotune["shapes"]} == {
        json.dumps(r["shape"], sort_keys=True) for r in graphs["shapes"]
    }
    for row in autotune["shapes"]:  # every shape under every tactic: the fastest wins, unless inside the noise
        assert len(row["timings_ms"]) >= 2
        fastest = min(row["timings_ms"], key=row["timings_ms"].get)
        assert row["fastest"] == fastest
        assert f"attn_impl={row['winner']['attn_impl']}" == ("attn_impl=sdpa" if row["tie"] else fastest)
    assert autotune["threads"] == "serving host" and autotune["conditions"]["cpus"] >= 1
    listed = {b["kind"]: b for b in json.loads(baked.prebake("ls", "--json").stdout)["bundles"]}
    assert listed["autotune"]["labels"]["autotune.cpus"] == str(autotune["conditions"]["cpus"])  # prebake ls shows them
    tree = Path(env["PREBAKE_GRAPHS_DIR"])  # the default variant's tree: its AOTInductor package alone
    assert graphs["variant"] == "aoti-package" and graphs["fallback"] == "none"
    assert (tree / "aoti" / "steps.pt2").is_file() and not (tree / "aot").exists()


@pytest.mark.slow
def test_shell_exports_point_at_the_installed_trees(baked):
    fetched = baked.prebake("fetch", "--model", "tiny-llama", "--precision", "bf16")
    assert fetched.returncode == 0
    assert "export TORCHINDUCTOR_CACHE_DIR=" in fetched.stdout and "export PREBAKE_BUCKETS_FILE=" in fetched.stdout


@pytest.mark.slow
def test_the_baked_package_serves_from_a_copied_folder_without_dynamo(baked, tmp_path):
    env = json.loads(baked.prebake("fetch", "--model", "tiny-llama", "--precision", "bf16", "--json").stdout)["env"]
    copy = tmp_path / "graphs"
    shutil.copytree(env["PREBAKE_GRAPHS_DIR"], copy)
    probe = f"""
import json, sys
from pathlib import Path
from prebake.artifacts.recipe.schema import load_recipe
from prebake.engine.bundled.build import model_and_cache
from prebake.engine.bundled.runtime import aoti
from prebake.engine.bundled.runtime.autotune import load_winners
winners = load_winners({env["PREBAKE_AUTOTUNE_FILE"]!r})
model, cache = model_and_cache(load_recipe("tiny-llama"), "bf16")
steps = aoti.load_package(model, cache, list(winners), Path({str(copy)!r}))
shape, tactic = next(iter(winners.items()))
out = steps.run_dummy(shape, tactic)
print(json.dumps({{"type": type(steps).__name__, "finite": bool(out.float().isfinite().all()),
                  "dynamo": "torch._dynamo" in sys.modules}}))
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=600, env=baked.env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"type": "PackageSteps", "finite": True, "dynamo": False}


@pytest.mark.slow
def test_second_bake_runs_no_action_and_imports_no_torch(baked):
    wrapper = (
        "import sys; from doit.doit_cmd import DoitMain; from doit.cmd_base import DodoTaskLoader;"
        "rc = DoitMain(DodoTaskLoader()).run(sys.argv[1:]);"
        "assert 'torch' not in sys.modules, 'a no-op bake imported torch'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            "run",
            "-f",
            str(REPO / "dodo.py"),
            "--db-file",
            str(baked.root / "doit.db"),
            "bake",
            "model=tiny-llama",
            "precision=bf16",
        ],
        env=baked.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    task_lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert task_lines and all(line.startswith("-- ") for line in task_lines), proc.stdout


@pytest.mark.slow
def test_fetch_of_an_unbaked_precision_exits_3_and_explains_the_miss(baked):
    proc = baked.prebake("fetch", "--model", "tiny-llama", "--precision", "fp32")
    assert proc.returncode == 3
    assert "precision.dtype: fp32 here, bf16 there" in proc.stderr


def test_unknown_model_lists_the_recipes(tmp_path):
    proc = Home(tmp_path).doit("run", "bake", "model=gpt-17")
    assert proc.returncode != 0
    assert "no recipe named 'gpt-17'" in proc.stdout + proc.stderr and "tiny-llama" in proc.stdout + proc.stderr


def test_bake_without_a_model_says_how_to_name_one(tmp_path):
    proc = Home(tmp_path).doit("run", "bake")
    assert proc.returncode != 0 and "doit bake model=<name>" in proc.stdout + proc.stderr


def test_doit_list_documents_the_bake_task(tmp_path):
    proc = Home(tmp_path).doit("list", "--all", "bake", "model=tiny-llama", "precision=bf16")
    assert proc.returncode == 0, proc.stderr
    assert "Bake a recipe for this host" in proc.stdout
    assert "bake:tiny-llama/cpu/tp1/bf16:graphs" in proc.stdout


def test_fetch_on_an_empty_registry_exits_3(tmp_path):
    proc = Home(tmp_path).prebake("fetch", "--model", "tiny-llama", "--precision", "bf16")
    assert proc.returncode == 3 and "no bundle for this key" in proc.stderr


@pytest.mark.slow
def test_prebake_copy_to_oci_and_back_leaves_bundles_the_engine_starts_from(baked, tmp_path):
    """issue 31's done-when: the default recipe's bundles (its model, variant and autotune; one short
    sequence), `prebake copy` folder -> OCI -> folder, then
    `prebake serve --on-miss fail` from the copy: every tree verifies, and the engine starts on them."""
    from tests.support.oci_server import oci_available, oci_server
    from tests.support.serving import ServeProcess, serve_env

    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    back = tmp_path / "back"
    with oci_server(tmp_path / "oci") as server:
        address, env = server.address("team/promoted"), server.env()
        there = baked.prebake("copy", str(baked.root / "home" / "registry"), address, "--json", extra_env=env)
        assert there.returncode == 0 and json.loads(there.stdout)["copied"] == 3, there.stderr
        again = baked.prebake("copy", address, str(back), "--json", extra_env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["copied"] == 3, again.stderr
    server_process = ServeProcess(
        ["--model", "tiny-llama", "--precision", "bf16", "--registry", str(back), "--on-miss", "fail"],
        serve_env(tmp_path / "node", baked.recipes),
    )
    try:
        server_process.wait_ready()
        completion = server_process.complete(prompt=[5, 17, 300], max_tokens=4, temperature=0)
    finally:
        server_process.stop()
    assert completion, server_process.log


# What a process may keep in torch's machine folder ($TMPDIR/torchinductor_$USER) for the next one, the
# one folder written outside the store on purpose (docs/operations.md): Inductor's precompiled headers
# and the vector-ISA probe sets (runtime.isa_probes). A start's or a bake's own TMPDIR links it.
MACHINE_SETS = {"precompiled_headers", SETS_DIR}


def seeded_temp(temp: Path) -> Path:
    """A new temporary folder holding torch's machine folder with only its two sets, each a link to the
    machine's own (made if absent): the bake under it reuses the precompiled headers and the probe set
    that the rest of the suite makes (under torch's lock), where an empty folder compiled both again
    (about 25 s of a core), and anything else it writes into the machine folder lands in this one,
    where `_left_in` sees it."""
    name = torch_machine_folder_name()
    folder = temp / name
    folder.mkdir(parents=True)
    for kept in MACHINE_SETS:
        machine = Path(tempfile.gettempdir()) / name / kept
        machine.mkdir(parents=True, exist_ok=True)
        (folder / kept).symlink_to(machine, target_is_directory=True)
    return temp


def _left_in(temp: Path) -> list[str]:
    """What a run left in the temporary folder `temp`, torch's machine folder's sets aside."""
    left = []
    for path in sorted(temp.iterdir()):
        if path.name.startswith("torchinductor_") and path.is_dir():
            left += [f"{path.name}/{p.name}" for p in path.iterdir() if p.name not in MACHINE_SETS]
        else:
            left.append(path.name)
    return left


@pytest.mark.slow
def test_the_bake_leaves_nothing_in_the_temporary_folder_and_shows_no_dependency_deprecation(baked):
    """issue 49 item 8: what the build children write goes to their scratch folders in the store, and
    torch's FutureWarning at every step shape (`isinstance(treespec, LeafSpec)`) goes to the debug log."""
    assert _left_in(baked.root / "systemp") == []
    log = (baked.root / "bake.log").read_text()
    assert "FutureWarning" not in log and "DeprecationWarning" not in log, log[-3000:]


@pytest.mark.slow
def test_a_killed_prebaked_start_leaves_nothing_outside_the_store_and_gc_takes_the_rest(baked, tmp_path):
    """issue 49 item 8: every prebaked start left an aotinductor_<random suffix> folder (torch's package loader
    extracts the library there) in the temporary folder; killed, it stays. Now it is under the start's
    scratch folder in the store, which gc removes once its owner is dead."""
    from tests.support.serving import ServeProcess

    systemp, home = tmp_path / "systemp", tmp_path / "home"
    systemp.mkdir()
    env = {**baked.env, "PREBAKE_HOME": str(home), "TMPDIR": str(systemp)}
    registry = str(baked.root / "home" / "registry")
    server = ServeProcess(
        ["--model", "tiny-llama", "--precision", "bf16", "--registry", registry, "--on-miss", "fail"], env
    )
    try:
        server.wait_ready(timeout=600)
        extracted = list((home / "tmp").glob("serve-*/tmp/aotinductor_*"))
        assert extracted, f"the package was not extracted under the start's scratch folder: {server.log[-2000:]}"
    finally:
        server.proc.send_signal(signal.SIGKILL)
        server.wait_exit(timeout=60)
    assert _left_in(systemp) == []
    assert list((home / "tmp").glob("serve-*"))  # the dead start's folder, until gc
    gc = subprocess.run([str(BIN / "prebake"), "store", "gc"], env=env, cwd=REPO, capture_output=True, text=True)
    assert gc.returncode == 0, gc.stderr
    assert not list((home / "tmp").glob("serve-*")), gc.stdout


@pytest.mark.slow
def test_torch_compile_started_with_fetchs_environment_leaves_the_tree_verified(baked, tmp_path):
    """issue 49 item 9: every exported path exists and is what its name says; the installed trees are
    read-only; TORCHINDUCTOR_CACHE_DIR is a writable cache beside the tree, and a torch process
    started with the exports compiles there while the tree still verifies."""
    env = {**baked.env, "PREBAKE_HOME": str(tmp_path / "home")}
    registry = str(baked.root / "home" / "registry")
    fetched = subprocess.run(
        [str(BIN / "prebake"), "fetch", "--model", "tiny-llama", "--precision", "bf16", "--registry", registry, "--json"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert fetched.returncode == 0, fetched.stderr
    exported = json.loads(fetched.stdout)["env"]
    for name, value in exported.items():
        path = Path(value)
        assert path.exists(), f"{name}={value} does not exist"
        assert path.is_dir() == name.endswith("_DIR"), f"{name}={value} is not what its name says"
    trees = tmp_path / "home" / "trees"
    cache = Path(exported["TORCHINDUCTOR_CACHE_DIR"])
    assert not cache.is_relative_to(trees) and Path(exported["PREBAKE_GRAPHS_DIR"]).is_relative_to(trees)
    installed = [p for tree in trees.iterdir() if tree.is_dir() for p in (tree, *tree.rglob("*")) if not p.is_symlink()]
    assert installed and not any(p.stat().st_mode & 0o222 for p in installed), "an installed tree is writable"
    user = "import torch; f = torch.compile(lambda x: torch.sin(x) * 2 + 1); print(float(f(torch.ones(8)).sum()))"
    ran = subprocess.run(
        [sys.executable, "-c", user], env={**env, **exported}, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert any(cache.rglob("*")), "torch.compile wrote nothing into the exported cache"
    assert not (Path(exported["PREBAKE_GRAPHS_DIR"]) / "inductor").exists()
    verified = subprocess.run(
        [str(BIN / "prebake"), "store", "verify", "--json"], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert verified.returncode == 0 and json.loads(verified.stdout)["findings"] == [], verified.stdout
