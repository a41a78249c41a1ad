"""The OCI done-when, end to end: `doit bake ... registry=oci://127.0.0.1:PORT/team/prebake` bakes
a test recipe (real torch.compile) into Debian's docker-registry (htpasswd over TLS, a CA the test
makes, the login in a Docker config.json); `prebake fetch` from a fresh PREBAKE_HOME installs from
it; skopeo shows the artifact with its annotations; umoci unpacks the graphs tree file for file.

The recipe is the serving tests' two-layer model at one sequence (two step shapes, bf16): the
subject is the registry, not the compile, and tiny-llama's seven shapes made this the suite's
third-slowest setup (132 s under load)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.baking import Home
from tests.support.oci_server import oci_available, oci_server, umoci_unpack
from tests.support.serving import write_recipe

pytestmark = pytest.mark.slow

MODEL = "oci-test"


@pytest.fixture(scope="module")
def oci_baked(tmp_path_factory):
    if not oci_available() or shutil.which("skopeo") is None or shutil.which("umoci") is None:
        pytest.skip("docker-registry, skopeo and umoci are needed (apt-get install; .ci/run does)")
    root = tmp_path_factory.mktemp("oci-bake")
    with oci_server(root / "server", tls=True, users={"baker": "bake-password"}) as server:
        write_recipe(root / "recipes", MODEL, variant="aoti-package", seqs=1, dtype="bf16")
        env = {**server.env(docker_config=root / "docker"), "PREBAKE_RECIPES": str(root / "recipes")}
        address = server.address("team/prebake")
        home = Home(root / "baker")
        proc = home.doit("run", "bake", f"model={MODEL}", "precision=bf16", f"registry={address}", extra_env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield server, env, address, root


def test_a_bake_into_the_oci_registry_is_fetched_from_a_fresh_home(oci_baked):
    server, env, address, root = oci_baked
    fresh = Home(root / "fresh")

    listing = fresh.prebake("ls", "--registry", address, extra_env=env)
    fetched = fresh.prebake(
        "fetch", "--model", MODEL, "--precision", "bf16", "--registry", address, "--json", extra_env=env
    )

    assert listing.returncode == 0, listing.stderr
    assert sorted(line.split()[1] for line in listing.stdout.splitlines()[1:]) == ["autotune", "buckets", "graphs"]
    assert fetched.returncode == 0, fetched.stderr
    graphs = Path(json.loads(fetched.stdout)["env"]["PREBAKE_GRAPHS_DIR"])
    assert (graphs / "graphs.json").is_file()


def test_skopeo_shows_the_graphs_artifact_and_umoci_unpacks_the_installed_tree(oci_baked, tmp_path):
    from prebake.registry.oci import OCIRegistry
    from tests.contract.test_oci_backend import _files

    server, env, address, root = oci_baked
    import os

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        registry = OCIRegistry(address)
        (graphs,) = list(registry.list("graphs"))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    tag = f"graphs-{graphs.key_digest}"
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(server.ca, certs / "ca.crt")
    auth = ["--authfile", str(root / "docker" / "config.json")]
    ref = f"docker://{server.host}/team/prebake:{tag}"
    raw = subprocess.run(
        ["skopeo", "inspect", *auth, "--cert-dir", str(certs), "--raw", ref], capture_output=True, text=True
    )
    assert raw.returncode == 0, raw.stderr
    notes = json.loads(raw.stdout)["annotations"]
    assert notes["org.prebake.kind"] == "graphs" and notes["org.prebake.label.model"] == MODEL
    assert notes["org.prebake.label.precision"] == "bf16"

    copied = subprocess.run(
        ["skopeo", "copy", *auth, "--src-cert-dir", str(certs), "--dest-compress", "--dest-compress-format=gzip",
         ref, f"oci:{tmp_path / 'layout'}:graphs"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    umoci_unpack(f"{tmp_path / 'layout'}:graphs", tmp_path / "bundle")
    fresh = Home(root / "fresh")
    fetched = fresh.prebake(
        "fetch", "--model", MODEL, "--precision", "bf16", "--registry", address, "--json", extra_env=env
    )
    tree = Path(json.loads(fetched.stdout)["env"]["PREBAKE_GRAPHS_DIR"])
    assert _files(tmp_path / "bundle" / "rootfs") == _files(tree)


def test_prebake_fetch_uses_a_mounted_graphs_tree_that_matches_and_refuses_one_that_does_not(oci_baked, tmp_path):
    """The image-volume path: the graphs bundle as umoci unpacks it, read-only, given to --mounted."""
    server, env, address, root = oci_baked
    fresh = Home(root / "fresh")
    listing = fresh.prebake("ls", "--registry", address, "--kind", "graphs", "--json", extra_env=env)
    key = json.loads(listing.stdout)["bundles"][0]["key"]
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(server.ca, certs / "ca.crt")
    ref = f"docker://{server.host}/team/prebake:graphs-{key}"
    copied = subprocess.run(
        ["skopeo", "copy", "--authfile", str(root / "docker" / "config.json"), "--src-cert-dir", str(certs),
         "--dest-compress", "--dest-compress-format=gzip", ref, f"oci:{tmp_path / 'layout'}:graphs"],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    good, bad = (umoci_unpack(f"{tmp_path / 'layout'}:graphs", tmp_path / name) for name in ("good", "bad"))
    (bad / "graphs.json").write_text("{}")
    for tree in (good, bad):
        for path in [tree, *tree.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode & ~0o222)
    args = ("fetch", "--model", MODEL, "--precision", "bf16", "--registry", address, "--json")
    other = Home(root / "mounted")

    used = other.prebake(*args, "--mounted", f"graphs={good}", extra_env=env)
    refused = other.prebake(*args, "--mounted", f"graphs={bad}", extra_env=env)

    assert used.returncode == 0, used.stderr
    assert json.loads(used.stdout)["env"]["PREBAKE_GRAPHS_DIR"] == str(good)
    assert refused.returncode != 0 and "wrong bytes in graphs.json" in refused.stderr
    assert "Traceback" not in refused.stderr
