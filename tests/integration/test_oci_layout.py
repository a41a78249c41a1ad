"""OCI image layouts written and read by prebake, round-tripped through Debian's tools:

prebake copy FOLDER oci-layout:DIR          prebake fetch --registry oci-layout:DIR installs, offline
skopeo copy oci:DIR:TAG docker://...        (every tag) prebake fetch from that registry installs the same trees
umoci unpack --image DIR:TAG                unpacks a bundle into the tree prebake installs
skopeo copy docker://...:TAG oci:DIR2:TAG   (every tag) a layout skopeo wrote reads back as a registry
prebake copy FOLDER oci-layout:FILE.tar     fetch reads the tar as a registry
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.baking import Home
from tests.support.oci_server import oci_available, oci_server, umoci_unpack
from tests.support.seeding import plan_here, seed

FETCH = ("fetch", "--model", "tiny-llama", "--precision", "bf16", "--json")


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> Path:
    if not oci_available() or shutil.which("skopeo") is None or shutil.which("umoci") is None:
        pytest.skip("docker-registry, skopeo and umoci are needed (apt-get install; .ci/run does)")
    root = tmp_path_factory.mktemp("layout")
    seed(root / "staging", root / "scratch", plan_here())
    done = Home(root / "operator").prebake("copy", str(root / "staging"), f"oci-layout:{root / 'layout'}", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["copied"] == 3
    return root


def fetched_trees(home: Home, registry: str, env: dict[str, str] | None = None) -> dict[str, dict[str, bytes]]:
    """What `prebake fetch` installs from `registry`: every kind's files and their bytes."""
    done = home.prebake(*FETCH, "--registry", registry, extra_env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    said = json.loads(done.stdout)
    assert said["complete"], said["misses"]
    return {kind: _files(Path(b["tree"])) for kind, b in said["bundles"].items()}


def _files(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


def _tags(layout: Path) -> list[str]:
    index = json.loads((layout / "index.json").read_text())
    return [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]]


def _skopeo(*args: str) -> None:
    done = subprocess.run(["skopeo", "copy", "--quiet", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_layout_prebake_wrote_installs_offline_through_skopeo_into_a_registry_and_under_umoci(carried, tmp_path):
    layout = carried / "layout"
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    want = fetched_trees(Home(tmp_path / "from-staging"), str(carried / "staging"))
    assert fetched_trees(Home(tmp_path / "offline"), f"oci-layout:{layout}") == want

    tags = _tags(layout)
    assert len([t for t in tags if not t.startswith("prebake-")]) == 3
    with oci_server(tmp_path / "site-registry") as site:
        for tag in tags:
            _skopeo("--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{site.host}/team/site:{tag}")
        assert fetched_trees(Home(tmp_path / "site"), site.address("team/site"), site.env()) == want

        back = tmp_path / "skopeo-layout"
        for tag in tags:
            _skopeo("--src-tls-verify=false", f"docker://{site.host}/team/site:{tag}", f"oci:{back}:{tag}")
    assert fetched_trees(Home(tmp_path / "from-skopeo"), f"oci-layout:{back}") == want

    graphs = next(t for t in tags if t.startswith("graphs-"))
    gzipped = (
        tmp_path / "gzip-layout"
    )  # Debian's umoci (0.4) unpacks no zstd layer: recompressed, as test_oci_bake does
    _skopeo("--dest-compress", "--dest-compress-format=gzip", f"oci:{layout}:{graphs}", f"oci:{gzipped}:{graphs}")
    assert _files(umoci_unpack(f"{gzipped}:{graphs}", tmp_path / "unpacked")) == want["graphs"]


def test_a_tar_of_a_layout_is_a_registry_to_copy_into_and_fetch_from(carried, tmp_path):
    tar = tmp_path / "usb" / "prebake.tar"
    home = Home(tmp_path / "operator")
    done = home.prebake("copy", str(carried / "staging"), f"oci-layout:{tar}", "--json")
    assert done.returncode == 0, done.stderr
    assert tar.is_file() and not tar.with_name("prebake.tar.partial").exists()
    again = home.prebake("copy", str(carried / "staging"), f"oci-layout:{tar}", "--json")
    assert json.loads(again.stdout)["bytes_copied"] == 0
    want = fetched_trees(Home(tmp_path / "from-staging"), str(carried / "staging"))
    assert fetched_trees(Home(tmp_path / "site"), f"oci-layout:{tar}") == want
    back = home.prebake("copy", f"oci-layout:{tar}", str(tmp_path / "site-registry"), "--json")
    assert back.returncode == 0 and json.loads(back.stdout)["copied"] == 3, back.stderr
