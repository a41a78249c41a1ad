"""The OCI backend on Debian's docker-registry (TLS + htpasswd, a CA this session made), read back by
independent tools: skopeo (inspect, copy) and umoci (unpack). What standard tooling sees of a
bundle, that pushes are deterministic, that signatures and quarantine work as on the other
backends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from prebake.artifacts.fetch.pipeline import fetch_key
from prebake.artifacts.store.local import Store
from prebake.artifacts.store.settings import StoreLimits
from prebake.registry.oci import OCIRegistry
from prebake.registry.oci.artifact import ARTIFACT_TYPE, LAYER_TYPE, tag_for
from prebake.registry.review.verify import verify_registry
from prebake.registry.trust.signing import TrustPolicy, generate_keypair, sign
from tests.support.bundles import make_bundle
from tests.support.oci_server import umoci_unpack


def _needs(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (apt-get install {tool}; .ci/run does)")


def _repo(oci) -> tuple[str, str]:
    name = f"team/oci-{uuid.uuid4().hex[:8]}"
    return name, oci.address(name)


def _skopeo(oci, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    _needs("skopeo")
    auth = Path(os.environ["DOCKER_CONFIG"]) / "config.json"
    certs = tmp_path / "skopeo-certs"
    certs.mkdir(exist_ok=True)
    shutil.copy(oci.ca, certs / "ca.crt")
    command, *rest = args
    flags = {"inspect": ["--cert-dir", str(certs)], "copy": ["--src-cert-dir", str(certs)]}[command]
    out = subprocess.run(
        ["skopeo", command, "--authfile", str(auth), *flags, *rest], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out


def test_a_bundle_is_one_oci_manifest_whose_layer_is_the_blob_with_its_factors_as_annotations(oci, tmp_path):
    name, address = _repo(oci)
    b = make_bundle(tmp_path, payload_bytes=32 << 10)
    OCIRegistry(address).publish(b.manifest, b.blob)
    ref = f"docker://{oci.host}/{name}:{tag_for('graphs', b.manifest.key_digest)}"

    raw = json.loads(_skopeo(oci, tmp_path, "inspect", "--raw", ref).stdout)
    shown = json.loads(_skopeo(oci, tmp_path, "inspect", ref).stdout)

    assert raw["artifactType"] == ARTIFACT_TYPE and raw["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    (layer,) = raw["layers"]
    assert layer["mediaType"] == LAYER_TYPE
    assert (layer["digest"], layer["size"]) == (b.manifest.blob.digest, b.manifest.blob.size)
    notes = raw["annotations"]
    assert notes["org.prebake.kind"] == "graphs" and notes["org.prebake.key-digest"] == b.manifest.key_digest
    assert notes["org.prebake.label.model"] == "tiny-llama"
    assert (
        notes["org.prebake.key.model.name"] == "tiny-llama" and notes["org.prebake.key.software.torch"] == "2.13.0+cpu"
    )
    assert json.loads(notes["org.prebake.manifest"]) == json.loads(b.manifest.to_bytes())
    assert "org.opencontainers.image.created" not in notes
    assert shown["Layers"] == [b.manifest.blob.digest] and shown["Os"] == "linux"


def test_the_same_bundle_pushed_twice_anywhere_has_the_same_manifest_digest(oci, tmp_path):
    b = make_bundle(tmp_path)
    digests = []
    for _ in range(2):
        name, address = _repo(oci)
        registry = OCIRegistry(address)
        registry.publish(b.manifest, b.blob)
        got = registry.read_manifest(tag_for("graphs", b.manifest.key_digest))
        assert got is not None
        digests.append(got[1])
        shown = json.loads(
            _skopeo(
                oci, tmp_path, "inspect", f"docker://{oci.host}/{name}:{tag_for('graphs', b.manifest.key_digest)}"
            ).stdout
        )
        assert shown["Digest"] == got[1]

    assert digests[0] == digests[1]


def test_skopeo_copies_the_artifact_to_a_directory_with_the_blob_byte_for_byte(oci, tmp_path):
    name, address = _repo(oci)
    b = make_bundle(tmp_path, payload_bytes=256 << 10)
    OCIRegistry(address).publish(b.manifest, b.blob)
    out = tmp_path / "copied"

    _skopeo(
        oci, tmp_path, "copy", f"docker://{oci.host}/{name}:{tag_for('graphs', b.manifest.key_digest)}", f"dir:{out}"
    )

    layer = out / b.manifest.blob.hex
    assert layer.read_bytes() == b.blob.read_bytes()


def test_umoci_unpacks_exactly_the_tree_prebake_fetch_installs(oci, tmp_path):
    _needs("umoci")
    name, address = _repo(oci)
    b = make_bundle(tmp_path, payload_bytes=64 << 10)
    registry = OCIRegistry(address)
    registry.publish(b.manifest, b.blob)
    installed = fetch_key(Store(tmp_path / "home", StoreLimits()), registry, b.manifest.the_key())
    ref = f"docker://{oci.host}/{name}:{tag_for('graphs', b.manifest.key_digest)}"

    # Debian's umoci 0.4.7 predates tar+zstd layers ("blob is not correct mediatype"): skopeo reads
    # the zstd layer and recompresses it to gzip on the way into an OCI layout, and umoci unpacks that.
    _skopeo(
        oci,
        tmp_path,
        "copy",
        "--dest-compress",
        "--dest-compress-format=gzip",
        ref,
        f"oci:{tmp_path / 'layout'}:bundle",
    )
    unpacked = umoci_unpack(f"{tmp_path / 'layout'}:bundle", tmp_path / "unpacked")

    assert _files(unpacked) == _files(installed.tree)


def test_a_signed_manifest_verifies_after_the_round_trip_and_a_tampered_one_does_not(oci, tmp_path):
    from cryptography.hazmat.primitives import serialization

    _, address = _repo(oci)
    pem, line = generate_keypair("ci")
    key = serialization.load_pem_private_key(pem, password=None)
    b = make_bundle(tmp_path)
    signed = sign(b.manifest, key, "ci")  # type: ignore[arg-type]
    registry = OCIRegistry(address)
    registry.publish(signed, b.blob)
    policy = TrustPolicy.from_lines([line])

    back = registry.lookup("graphs", signed.key_digest)

    assert back == signed and policy.check(back) is None
    assert policy.check(back.model_copy(update={"labels": {"model": "other"}})) is not None
    assert verify_registry(registry, trust=policy, quarantine=False).exit_code == 0


def test_quarantine_moves_a_corrupt_bundle_aside_and_a_republish_restores_it(oci, tmp_path):
    _, address = _repo(oci)
    registry = OCIRegistry(address)
    good, bad = make_bundle(tmp_path, model="good"), make_bundle(tmp_path, model="bad", payload_bytes=8192)
    for b in (good, bad):
        registry.publish(b.manifest, b.blob)
    oci.blob_file(bad.manifest.blob.digest).write_bytes(os.urandom(bad.manifest.blob.size))

    report = verify_registry(registry, trust=None, quarantine=True)

    assert report.exit_code == 1 and len(report.findings) == 1
    (finding,) = report.findings
    assert finding.quarantined_to and f":quarantine-graphs-{bad.manifest.key_digest}" in finding.quarantined_to
    assert registry.lookup("graphs", bad.manifest.key_digest) is None
    assert registry.lookup("graphs", good.manifest.key_digest) == good.manifest
    assert f"quarantine-graphs-{bad.manifest.key_digest}" in set(registry.tags())
    again = verify_registry(registry, trust=None, quarantine=True)
    assert again.exit_code == 0 and again.entries == 1


def test_a_manifest_naming_a_missing_blob_is_refused_by_the_registry_so_no_tag_can_name_one(oci, tmp_path):
    from prebake.artifacts.ports.errors import RegistryError
    from prebake.registry.oci.artifact import build

    _, address = _repo(oci)
    registry = OCIRegistry(address)
    b = make_bundle(tmp_path)
    artifact = build(b.manifest, "sha256:" + "0" * 64)
    registry.push_bytes(artifact.config_ref, artifact.config)  # the config, but never the layer

    with pytest.raises(RegistryError, match="MANIFEST_BLOB_UNKNOWN|BLOB_UNKNOWN"):
        registry.put_manifest(tag_for("graphs", b.manifest.key_digest), artifact.manifest)

    assert registry.lookup("graphs", b.manifest.key_digest) is None


def test_a_large_file_list_rides_in_the_image_config_and_reads_back(oci, tmp_path, monkeypatch):
    import prebake.registry.oci.artifact as artifact

    monkeypatch.setattr(artifact, "INLINE_LIMIT", 64)
    _, address = _repo(oci)
    registry = OCIRegistry(address)
    b = make_bundle(tmp_path)
    registry.publish(b.manifest, b.blob)
    got = registry.read_manifest(tag_for("graphs", b.manifest.key_digest))
    assert got is not None and "org.prebake.manifest" not in json.loads(got[0])["annotations"]

    assert registry.lookup("graphs", b.manifest.key_digest) == b.manifest
    assert [m.key_digest for m in registry.list()] == [b.manifest.key_digest]


@pytest.mark.parametrize(
    "address",
    ["oci://", "oci://ghcr.io", "oci://ghcr.io/", "oci://ghcr.io/Acme/Prebake", "oci://bad host/x/y", "s3://x/y"],
)
def test_a_malformed_address_is_refused_with_the_form_it_takes(address):
    from prebake.artifacts.ports.errors import RegistryError

    with pytest.raises(RegistryError, match=r"oci://HOST\[:PORT\]/NAMESPACE/REPO"):
        OCIRegistry(address)


def _files(root: Path) -> dict[str, tuple[str, int, bytes]]:
    """Every path under root: its type, its mode's permission bits and its bytes (or link target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("link", 0, os.readlink(path).encode())
        elif path.is_dir():
            out[rel] = ("dir", 0, b"")
        else:
            out[rel] = ("file", path.stat().st_mode & 0o111, path.read_bytes())
    return out


# -- image volumes: a tree mounted read-only, checked against its signed manifest -------------------


def _umoci_tree(oci, tmp_path: Path, name: str, tag: str) -> Path:
    """The bundle as an image volume would mount it: unpacked by umoci (after skopeo made it gzip), read-only."""
    _needs("umoci")
    ref = f"docker://{oci.host}/{name}:{tag}"
    _skopeo(oci, tmp_path, "copy", "--dest-compress", "--dest-compress-format=gzip", ref, f"oci:{tmp_path / 'iv'}:b")
    return umoci_unpack(f"{tmp_path / 'iv'}:b", tmp_path / "volume")


def _read_only(tree: Path) -> None:
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)


def test_a_mounted_tree_unpacked_by_umoci_checks_out_against_its_signed_manifest(oci, tmp_path):
    from cryptography.hazmat.primitives import serialization

    from prebake.artifacts.fetch.gate import verify_entry
    from prebake.artifacts.fetch.mounted import check_mounted

    name, address = _repo(oci)
    pem, line = generate_keypair("ci")
    b = make_bundle(tmp_path, payload_bytes=64 << 10)
    signed = sign(b.manifest, serialization.load_pem_private_key(pem, password=None), "ci")  # type: ignore[arg-type]
    registry = OCIRegistry(address)
    registry.publish(signed, b.blob)
    tree = _umoci_tree(oci, tmp_path, name, tag_for("graphs", signed.key_digest))
    _read_only(tree)
    found = registry.lookup("graphs", signed.key_digest)
    assert found is not None
    verified = verify_entry(signed.the_key(), found, TrustPolicy.from_lines([line]))
    assert not isinstance(verified, type(None)) and verified == signed

    installed = check_mounted(tree, verified)  # type: ignore[arg-type]

    assert installed.tree == tree and installed.manifest == signed
    assert not any(p.stat().st_mode & 0o222 for p in tree.rglob("*") if p.is_file()), "nothing was written"


@pytest.mark.parametrize("damage", ["edited", "extra", "missing", "mode"])
def test_a_mounted_tree_that_differs_from_its_manifest_is_refused_naming_the_difference(oci, tmp_path, damage):
    from prebake.artifacts.errors import BundleError
    from prebake.artifacts.fetch.mounted import check_mounted

    name, address = _repo(oci)
    b = make_bundle(tmp_path, payload_bytes=16 << 10)
    OCIRegistry(address).publish(b.manifest, b.blob)
    tree = _umoci_tree(oci, tmp_path, name, tag_for("graphs", b.manifest.key_digest))
    target = tree / "fxgraph" / "entry.txt"
    if damage == "edited":
        target.write_text("graphs of another model\n")
    elif damage == "extra":
        (tree / "planted.py").write_text("import os\n")
    elif damage == "missing":
        target.unlink()
    else:
        target.chmod(0o755)
    _read_only(tree)
    why = {
        "edited": "wrong bytes in fxgraph/entry.txt",
        "extra": "unexpected planted.py",
        "missing": "missing fxgraph/entry.txt",
        "mode": "fxgraph/entry.txt is executable",
    }

    with pytest.raises(BundleError, match=f"is not the graphs bundle .*{why[damage]}.*mount the image of that bundle"):
        check_mounted(tree, b.manifest)
