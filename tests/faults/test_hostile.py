"""A registry written by an attacker: hostile sizes and shapes, not only wrong bytes.

Each scenario plants what someone with write access to a registry could put there (a blob
far larger than its manifest says, a decompression bomb, a manifest nested a million deep,
an index entry that reads forever, a second manifest for a tree already installed, a
relabelled signed manifest) and checks that prebake refuses it cleanly, within a bound of
time and bytes, and leaves the store exactly as verifiable as before (the scenario fixture
re-verifies every store deeply afterwards). The attacked registry itself is not registered
for re-verification: it is damaged on purpose.

Every scenario runs under the policy in force (tests/faults/in_force.py), and every forgery is
signed with the key that policy trusts: the worst case, an attacker who holds the key or a
builder gone bad, so that the checks behind the signature (sizes, the unpacker, the file list)
are what must refuse it, not the signature check in front of them.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import zstandard

from prebake.artifacts.bundle.manifest import FileEntry, Manifest
from prebake.artifacts.errors import BundleError, PrebakeError, StoreError
from prebake.artifacts.fetch.outcome import Miss
from prebake.artifacts.keys import Key
from prebake.artifacts.layout import blob_relpath, index_relpath
from prebake.artifacts.ports.errors import BlobSizeMismatch
from prebake.registry.backends.file import FileRegistry
from tests.faults.procs import REPO, actor, child_env, killed, result, unbounded
from tests.support.bundles import make_bundle


@pytest.fixture
def s3_registry(bucket):
    """A fresh bucket on moto's server: (S3Registry, boto3 client, bucket)."""
    import boto3

    from prebake.registry.backends.s3 import S3Registry
    from prebake.registry.backends.s3_client import S3Settings

    return S3Registry(f"s3://{bucket}/prebake", S3Settings()), boto3.client("s3"), bucket


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _plant(root: Path, manifest: Manifest | bytes, blob: bytes | None = None, key_digest: str | None = None) -> None:
    """Write an index entry (and a blob) straight into a folder registry, as an attacker would."""
    if isinstance(manifest, Manifest):
        raw, kind, key_digest = manifest.to_bytes(), manifest.kind, manifest.key_digest
        if blob is not None:
            path = root / blob_relpath(manifest.blob.digest)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(blob)
    else:
        raw, kind = manifest, "graphs"
    entry = root / index_relpath(kind, key_digest)
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(raw)


def _forged(base: Manifest, blob: bytes, files: tuple[FileEntry, ...], name: str = "forged") -> Manifest:
    key = Key.of(base.kind, {"model": {"name": name}})
    return base.model_copy(
        update={
            "key": {g: dict(f) for g, f in key.groups},
            "key_digest": key.digest,
            "blob": base.blob.model_copy(update={"digest": _digest(blob), "size": len(blob)}),
            "files": files,
        }
    )


def _nothing_left(home: Path) -> None:
    left = [p.relative_to(home).as_posix() for p in home.rglob("*") if p.is_file() or p.is_symlink()]
    # stats record the refusal; prebake-store.json marks the folder as a store (artifacts/store/mark.py)
    left = [p for p in left if not p.startswith(("locks/", "leases/", "stats/")) and p != "prebake-store.json"]
    assert left == [], f"a refused bundle left {left}"


def _bomb(inflated: int, name: str = "kernels.bin", declared: int | None = None) -> bytes:
    """A .tar.zst holding one member of `inflated` zero bytes (declared in its header as such)."""
    header = tarfile.TarInfo(name)
    header.size = inflated if declared is None else declared
    head = header.tobuf(format=tarfile.GNU_FORMAT)
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as zw:
        zw.write(head)
        zeros = bytes(1 << 20)
        for _ in range(inflated >> 20):
            zw.write(zeros)
        zw.write(bytes(1024))
    return out.getvalue()


# -- sizes ---------------------------------------------------------------------------------------


def test_a_sparse_50_gb_blob_behind_a_small_manifest_is_refused_before_a_byte_is_copied(tmp_path, scenario, in_force):
    registry = FileRegistry(tmp_path / "registry")
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=64 << 10)
    registry.publish(bundle.manifest, bundle.blob)
    os.truncate(registry.blob_path(bundle.manifest.blob.digest), 50 << 30)  # sparse: costs no disk
    home = scenario.store(tmp_path / "home")
    start = time.monotonic()
    with pytest.raises(BlobSizeMismatch, match="is 53687091200 bytes, but its manifest says"):
        in_force.fetch(unbounded(home), registry, bundle.manifest.the_key())
    assert time.monotonic() - start < 5
    _nothing_left(home)


def test_a_decompression_bomb_stops_at_the_member_that_outgrows_its_declared_size(tmp_path, scenario, in_force):
    bomb = _bomb(1 << 30)  # 1 GiB of zeros in about 40 KB
    base = in_force.bundle(tmp_path / "bake").manifest
    declared = (FileEntry(path="kernels.bin", size=1024, sha256=_digest(bytes(1024))),)
    manifest = in_force.sign(_forged(base, bomb, declared))
    root = tmp_path / "registry"
    _plant(root, manifest, bomb)
    home = scenario.store(tmp_path / "home")
    start = time.monotonic()
    with pytest.raises(BundleError, match="1073741824 bytes in the archive, but its manifest says 1024 bytes"):
        in_force.fetch(unbounded(home), FileRegistry(root), manifest.the_key())
    assert time.monotonic() - start < 10, "refused at the header, not after inflating"
    _nothing_left(home)


def test_bytes_past_a_members_declared_size_are_never_written(tmp_path, scenario, in_force):
    bomb = _bomb(256 << 20, declared=4096)  # the header says 4 KiB; 256 MiB of zeros follow it
    base = in_force.bundle(tmp_path / "bake").manifest
    manifest = in_force.sign(
        _forged(base, bomb, (FileEntry(path="kernels.bin", size=4096, sha256=_digest(bytes(4096))),))
    )
    _plant(tmp_path / "registry", manifest, bomb)
    home = scenario.store(tmp_path / "home")
    start = time.monotonic()
    got = in_force.fetch(unbounded(home), FileRegistry(tmp_path / "registry"), manifest.the_key())
    assert not isinstance(got, Miss)
    assert time.monotonic() - start < 10, "the zeros after the member end the archive: nothing inflates them"
    written = sum(p.stat().st_size for p in (home / "trees").rglob("*") if p.is_file() and p.parent != home / "trees")
    assert written == 4096, "exactly the declared bytes; the blob's digest covers the rest"


def test_a_manifest_declaring_more_than_the_disk_holds_is_refused_up_front_with_a_clear_message(
    tmp_path, scenario, in_force
):
    bomb = _bomb(1 << 20)
    base = in_force.bundle(tmp_path / "bake").manifest
    huge = (FileEntry(path="kernels.bin", size=1 << 50, sha256=_digest(b"")),)  # a petabyte
    manifest = in_force.sign(_forged(base, bomb, huge))
    _plant(tmp_path / "registry", manifest, bomb)
    home = scenario.store(tmp_path / "home")
    store = unbounded(home)
    with pytest.raises(PrebakeError, match="over the cap|free space"):
        in_force.fetch(store, FileRegistry(tmp_path / "registry"), manifest.the_key())
    from prebake.artifacts.bundle.unpack import UnpackLimits
    from prebake.artifacts.store.settings import StoreLimits

    roomy = type(store)(home, StoreLimits(unpack=UnpackLimits(max_bytes=1 << 60)))
    with pytest.raises(StoreError, match=r"is full: installing .* needed .* MiB .* was free.*`prebake store gc"):
        in_force.fetch(roomy, FileRegistry(tmp_path / "registry"), manifest.the_key())
    _nothing_left(home)


def test_an_s3_blob_larger_than_its_manifest_says_is_refused_before_downloading(
    tmp_path, scenario, s3_registry, in_force
):
    registry, client, bucket = s3_registry
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=64 << 10)
    registry.publish(bundle.manifest, bundle.blob)
    key = f"{registry.s3.prefix}/{blob_relpath(bundle.manifest.blob.digest)}"
    client.put_object(Bucket=bucket, Key=key, Body=bundle.blob.read_bytes() + bytes(8 << 20))
    home = scenario.store(tmp_path / "home")
    with pytest.raises(BlobSizeMismatch, match="but its manifest says"):
        in_force.fetch(unbounded(home), registry, bundle.manifest.the_key())
    _nothing_left(home)


def test_a_corrupt_s3_stream_leaves_nothing_behind(tmp_path, scenario, s3_registry, in_force):
    registry, client, bucket = s3_registry
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=4 << 20)
    registry.publish(bundle.manifest, bundle.blob)
    data = bytearray(bundle.blob.read_bytes())
    data[-100] ^= 0xFF  # late in the stream: most members are written before the damage shows
    key = f"{registry.s3.prefix}/{blob_relpath(bundle.manifest.blob.digest)}"
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    home = scenario.store(tmp_path / "home")
    with pytest.raises(BundleError):
        in_force.fetch(unbounded(home), registry, bundle.manifest.the_key())
    _nothing_left(home)


@pytest.mark.parametrize("where", ["early", "late"])
def test_a_corrupt_streamed_blob_leaves_nothing_behind(tmp_path, scenario, where, in_force):
    registry = FileRegistry(tmp_path / "registry")
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=4 << 20)
    registry.publish(bundle.manifest, bundle.blob)
    path = registry.blob_path(bundle.manifest.blob.digest)
    data = bytearray(path.read_bytes())
    data[64 if where == "early" else len(data) - 64] ^= 0xFF
    path.write_bytes(bytes(data))
    home = scenario.store(tmp_path / "home")
    with pytest.raises(BundleError):
        in_force.fetch(unbounded(home), registry, bundle.manifest.the_key())
    _nothing_left(home)


# -- shapes --------------------------------------------------------------------------------------


def _entry_cases(tmp_path: Path, key_digest: str) -> dict[str, object]:
    long_name = "a" * 300
    doc = json.loads(make_bundle(tmp_path / "bake").manifest.to_bytes())  # its shape is what is hostile
    doc["files"][0]["path"] = long_name
    return {
        "nested": b"[" * 200_000 + b"]" * 200_000,
        "nested-in-labels": json.dumps({**doc, "labels": {"x": [[[[[[[[[[[]]]]]]]]]]]}}).encode(),
        "long-member-name": json.dumps(doc).encode(),
        "oversized": b" " * (65 << 20),
        "not-utf8": b"\xff\xfe" * 100,
        "fifo": "fifo",
        "link-to-dev-zero": "/dev/zero",
        "link-out-of-the-registry": str(tmp_path / "bake"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "nested",
        "nested-in-labels",
        "long-member-name",
        "oversized",
        "not-utf8",
        "fifo",
        "link-to-dev-zero",
        "link-out-of-the-registry",
    ],
)
def test_a_hostile_index_entry_is_a_clean_error_in_bounded_time_and_verify_reports_it(
    tmp_path, scenario, case, in_force
):
    bundle = in_force.bundle(tmp_path / "bake")
    root = tmp_path / "registry"
    entry = root / index_relpath("graphs", bundle.manifest.key_digest)
    entry.parent.mkdir(parents=True)
    value = _entry_cases(tmp_path, bundle.manifest.key_digest)[case]
    if value == "fifo":
        os.mkfifo(entry)
    elif isinstance(value, str):
        os.symlink(value, entry)
    else:
        entry.write_bytes(value)
    registry = FileRegistry(root)
    start = time.monotonic()
    with pytest.raises(PrebakeError):
        registry.lookup("graphs", bundle.manifest.key_digest)
    assert time.monotonic() - start < 10
    home = scenario.store(tmp_path / "home")
    cmd = [sys.executable, "-m", "prebake.engine.cli", "verify", "--deep", "--registry", str(root)]
    proc = subprocess.run(
        cmd, env=child_env(PREBAKE_HOME=str(home)), cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "1 bad" in proc.stdout, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_second_manifest_for_an_installed_tree_must_name_the_same_files(tmp_path, published, scenario, in_force):
    registry, bundle = published
    home = scenario.store(tmp_path / "home")
    store = unbounded(home)
    installed = in_force.fetch(store, registry, bundle.manifest.the_key())
    assert not isinstance(installed, Miss)
    blob = bundle.blob.read_bytes()
    liar = in_force.sign(_forged(bundle.manifest, blob, bundle.manifest.files[:1]))  # same blob, a file fewer
    other = tmp_path / "other-registry"
    _plant(other, liar, blob)
    with pytest.raises(BundleError, match="does not match this manifest"):
        in_force.fetch(store, FileRegistry(other), liar.the_key())
    assert store.lookup("graphs", liar.key_digest) is None
    assert store.lookup("graphs", bundle.manifest.key_digest) is not None, "the honest entry still stands"


def test_a_relabelled_signed_manifest_is_refused(tmp_path, scenario, in_force):
    bundle = in_force.bundle(tmp_path / "bake")
    relabelled = bundle.manifest.model_copy(update={"labels": {"model": "llama3-70b"}})  # the signature stays
    _plant(tmp_path / "registry", relabelled, bundle.blob.read_bytes())
    home = scenario.store(tmp_path / "home")
    got = in_force.fetch(unbounded(home), FileRegistry(tmp_path / "registry"), relabelled.the_key())
    assert isinstance(got, Miss) and got.refused and "no signature verifies" in got.reason
    _nothing_left(home)


def test_verify_deep_finds_a_file_list_that_disagrees_with_its_blob(tmp_path, scenario, in_force):
    from prebake.registry.review.verify import verify_registry

    bundle = in_force.bundle(tmp_path / "bake")
    blob = bundle.blob.read_bytes()
    renamed = tuple(f.model_copy(update={"path": "renamed/" + f.path}) for f in bundle.manifest.files)
    liar = in_force.sign(_forged(bundle.manifest, blob, renamed))
    _plant(tmp_path / "registry", liar, blob)
    registry = FileRegistry(tmp_path / "registry")
    trust = in_force.trust(registry)
    assert verify_registry(registry, trust=trust, quarantine=False).bad == 0, "shallow: signed, the blob hashes right"
    deep = verify_registry(registry, trust=trust, quarantine=False, deep=True)
    assert deep.bad == 1 and "does not match the entry's file list" in deep.findings[0].problem


# -- crashes -------------------------------------------------------------------------------------


def test_kill_9_in_the_middle_of_a_streamed_install_leaves_nothing_readable(tmp_path, scenario, in_force):
    registry = scenario.registry(FileRegistry(tmp_path / "registry"))
    bundle = in_force.bundle(tmp_path / "bake", payload_bytes=8 << 20)
    registry.publish(bundle.manifest, bundle.blob)
    scenario.registries[-1][1].append(bundle.manifest)
    home = scenario.store(tmp_path / "home")
    args = ["--home", str(home), "--registry", str(registry.root), "--key", bundle.manifest.key_digest]
    killed(actor("fetch", *args, env={"PREBAKE_TEST_CRASH_AT": "stream:fxgraph/*"}))
    store = unbounded(home)
    assert list(home.glob("trees/.*.partial")), "the process died elsewhere than mid-unpack"
    assert store.lookup("graphs", bundle.manifest.key_digest) is None
    assert not (home / "trees" / bundle.manifest.blob.hex).exists()
    again = result(actor("fetch", *args))
    assert again["problems"] == []
    assert not list(home.glob("trees/.*.partial")) and not list(home.glob("blobs/sha256/*/.tmp-*"))


# -- the command line's contract -----------------------------------------------------------------


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "prebake.engine.cli", *args]
    return subprocess.run(
        cmd, env=child_env(PREBAKE_HOME=str(home)), cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("case", ["nothing", "nested", "bomb", "fifo", "wrong-bytes"])
def test_prebake_fetch_exits_0_3_or_2_and_never_with_a_traceback(tmp_path, scenario, case, in_force):
    from prebake.artifacts.recipe.schema import load_recipe
    from prebake.engine.compose import Context

    context = Context.open(str(tmp_path / "registry"), store=unbounded(tmp_path / "home"))
    key = context.pick_plan(load_recipe("tiny-llama")).key("buckets")
    root = tmp_path / "registry"
    entry = root / index_relpath("buckets", key.digest)
    entry.parent.mkdir(parents=True)
    base = in_force.bundle(tmp_path / "bake", kind="buckets").manifest
    groups = {g: dict(f) for g, f in key.groups}
    if case == "nested":
        entry.write_bytes(b'{"kind": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    elif case == "fifo":
        os.mkfifo(entry)
    elif case in ("bomb", "wrong-bytes"):
        blob = _bomb(256 << 20)
        files = (FileEntry(path="kernels.bin", size=1024, sha256=_digest(bytes(1024))),)
        manifest = _forged(base, blob, files).model_copy(update={"key": groups, "key_digest": key.digest})
        manifest = in_force.sign(manifest)
        _plant(root, manifest, blob if case == "bomb" else blob[:-10] + bytes(10))
    home = scenario.store(tmp_path / "home")
    start = time.monotonic()
    proc = _cli(home, "fetch", "--model", "tiny-llama", "--registry", str(root))
    assert time.monotonic() - start < 60
    assert "Traceback" not in proc.stderr, proc.stderr
    # nothing there is a miss (exit 3); something there that fails a check is refused (exit 2):
    # never 0, never 1, never a crash
    assert proc.returncode == (3 if case == "nothing" else 2), proc.stderr
    wanted = {"nothing": "no bundle", "nested": "nests deeper|recursion", "fifo": "not a regular file"}
    wanted |= {"bomb": "268435456 bytes in the archive", "wrong-bytes": "corrupt|hashes to"}
    assert re.search(wanted[case], proc.stderr), proc.stderr
    _nothing_left(home)
