"""`prebake copy`'s logic (registry/copy.py) between a folder and every backend of the contract suite,
plus OCI image layouts (a folder and a tar), each way: signed bundles of tiny-llama's keys (seeded,
no compile) with their attestations and a signed revocation list, under a policy file that needs
all three; a second run moves no byte; what comes back installs into a store, file by file. One ring of direct
copies between the backends (S3 -> OCI -> Hub -> Azure -> layout) pairs each with another backend, and
every ordered pair of the non-folder backends is copied directly."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from prebake.artifacts.bake.provenance import SIDE_NAME
from prebake.artifacts.ports.registry import Buffered
from prebake.artifacts.store.local import Store
from prebake.registry.backends.file import FileRegistry
from prebake.registry.copy import Selection, copy_bundles, revocation_check_in_force
from prebake.registry.oci.layout import LayoutRegistry
from prebake.registry.trust.policy import trust_in_force
from prebake.registry.trust.revocation import LIST_NAME
from prebake.registry.trust.signing import write_keypair
from tests.contract.conftest import BACKENDS, Backend
from tests.support.staging import Staged, stage, write_policy


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Staged:
    return stage(tmp_path_factory.mktemp("staging"))


def policy_for(staged: Staged, registry, home: Path, policy: Path | None = None):
    return trust_in_force(
        {"PREBAKE_POLICY": str(policy or staged.policy)},
        address=registry.url,
        store_home=home,
        open_registry=lambda: registry,
    )


def copy(source, destination, staged: Staged, home: Path, **kw):
    trust = policy_for(staged, source, home)
    return copy_bundles(source, destination, trust=trust, check_revocations=revocation_check_in_force(trust), **kw)


def _layout(request, tmp_path: Path) -> Backend:
    address = f"oci-layout:{tmp_path / 'layout'}"
    return Backend("oci-layout", LayoutRegistry(address, create=True), _no_corrupt, lambda: LayoutRegistry(address))


def _layout_tar(request, tmp_path: Path) -> Backend:
    address = f"oci-layout:{tmp_path / 'carry.tar'}"
    return Backend("oci-layout-tar", LayoutRegistry(address, create=True), _no_corrupt, lambda: LayoutRegistry(address))


def _no_corrupt(digest: str, data: bytes) -> None:
    raise AssertionError("not used here")


TARGETS = {**BACKENDS, "oci-layout": _layout, "oci-layout-tar": _layout_tar}


@pytest.fixture(params=list(TARGETS))
def target(request, tmp_path) -> Backend:
    return TARGETS[request.param](request, tmp_path)


def _closed(registry) -> None:
    if isinstance(registry, Buffered):
        registry.finish()


def test_copy_to_and_from_every_backend_carries_bundles_attestations_and_the_revocation_list(staged, target, tmp_path):
    source = FileRegistry(staged.registry)
    manifests = {m.key_digest: m for m in source.list()}
    assert len(manifests) == 3

    there = copy(source, target.registry, staged, tmp_path / "home-1")
    _closed(target.registry)
    assert there.ok, there.to_json()
    assert there.count("copied") == 3 and there.bytes == sum(m.blob.size for m in manifests.values())
    assert there.revocation_list == "copied (serial 3)"
    assert all(c.side_files == (SIDE_NAME,) for c in there.bundles)

    again_into = target.second_client()
    if isinstance(again_into, LayoutRegistry) and again_into.tar is not None:
        again_into = LayoutRegistry(again_into.url, create=True)  # a tar is rewritten whole: reopen it to write
    again = copy(source, again_into, staged, tmp_path / "home-2")
    _closed(again_into)
    assert again.bytes == 0 and again.count("already there") == 3, again.to_json()
    assert again.summary().startswith(f"copy {source.url} -> {again_into.url}: nothing to copy: all 3 bundle(s)")
    assert again.revocation_list == "already there (serial 3)"

    back = FileRegistry(tmp_path / "production", create=True)
    returned = copy(target.second_client(), back, staged, tmp_path / "home-3")
    assert returned.ok and returned.count("copied") == 3, returned.to_json()
    store = Store(tmp_path / "node")
    for digest, m in manifests.items():
        got = back.lookup(m.kind, digest)
        assert got is not None and got.to_bytes() == m.to_bytes()  # the signed manifest, byte for byte
        assert back.get_side(m.blob.digest, SIDE_NAME) == source.get_side(m.blob.digest, SIDE_NAME)
        installed = store.install(got, back)  # the blob's digest, then every file against the list
        assert installed.tree.is_dir()
    assert back.get_meta(LIST_NAME) == source.get_meta(LIST_NAME)


def test_copy_refuses_what_the_policy_refuses_and_writes_nothing_of_it(staged, tmp_path):
    _, other = write_keypair("ci", tmp_path / "other-keys")  # same name, another key: the signatures do not verify
    _, rpublic = write_keypair("revoker", tmp_path / "other-keys")
    wrong = write_policy(tmp_path, other.read_text().strip(), rpublic.read_text().strip(), name="wrong")
    source, dest = FileRegistry(staged.registry), FileRegistry(tmp_path / "dest", create=True)
    trust = policy_for(staged, source, tmp_path / "home", wrong)
    report = copy_bundles(source, dest, trust=trust, select=Selection(kind="graphs"),
                          check_revocations=revocation_check_in_force(trust))  # fmt: skip
    assert report.revocation_list.startswith("refused: the source's revocation list does not verify")
    assert not report.ok and [c.outcome[:9] for c in report.bundles] == ["refused: "]
    assert "no signature verifies against the keys this rule trusts" in report.bundles[0].outcome
    assert list(dest.list("graphs")) == [] and dest.get_meta(LIST_NAME) is None


def test_copy_leaves_a_different_build_of_a_key_alone(staged, tmp_path):
    source = FileRegistry(staged.registry)
    elsewhere = stage(tmp_path / "other", build="second")  # the same keys, baked again: other blobs, other signatures
    dest = FileRegistry(elsewhere.registry)
    report = copy(source, dest, staged, tmp_path / "home", select=Selection(kind="graphs"))
    assert not report.ok and report.bundles[0].outcome.startswith("conflict: ")
    assert report.revocation_list.startswith("kept the destination's (serial 3 >= the source's 3")


def test_a_ring_through_every_backend_pairs_each_with_another_than_a_folder(staged, request, tmp_path):
    """folder -> S3 -> OCI -> Hub -> Azure -> OCI layout -> folder: each hop a direct copy between two backends."""
    ring = [BACKENDS[name](request, tmp_path / name).registry for name in ("s3", "oci", "hf", "azure")]
    ring.append(LayoutRegistry(f"oci-layout:{tmp_path / 'layout'}", create=True))
    source = FileRegistry(staged.registry)
    hops = [source, *ring, FileRegistry(tmp_path / "end", create=True)]
    for i, (a, b) in enumerate(pairwise(hops)):
        report = copy(a, b, staged, tmp_path / f"home-{i}")
        assert report.ok and report.count("copied") == 3, (a.url, b.url, report.to_json())
        assert report.revocation_list == "copied (serial 3)", (a.url, b.url)
    end = hops[-1]
    for m in source.list():
        assert end.lookup(m.kind, m.key_digest) == m
        assert end.get_side(m.blob.digest, SIDE_NAME) == source.get_side(m.blob.digest, SIDE_NAME)


DIRECT = ("s3", "oci", "hf", "azure", "oci-layout")  # the folder is either end of every case above


def _open(name: str, request, folder: Path):
    if name == "oci-layout":
        return LayoutRegistry(f"oci-layout:{folder / 'layout'}", create=True)
    return BACKENDS[name](request, folder).registry


@pytest.mark.parametrize(("first", "second"), [(a, b) for a in DIRECT for b in DIRECT if a != b])
def test_copy_between_every_pair_of_backends_directly(staged, request, tmp_path, first, second):
    """Every ordered pair of non-folder backends: seeded from the folder, then copied A -> B directly."""
    source = FileRegistry(staged.registry)
    a, b = _open(first, request, tmp_path / "a"), _open(second, request, tmp_path / "b")
    seeded = copy(source, a, staged, tmp_path / "home-a")
    assert seeded.ok and seeded.count("copied") == 3, seeded.to_json()
    report = copy(a, b, staged, tmp_path / "home-b")
    assert report.ok and report.count("copied") == 3, (a.url, b.url, report.to_json())
    assert report.revocation_list == "copied (serial 3)"
    for m in source.list():
        assert b.lookup(m.kind, m.key_digest) == m
        assert b.get_side(m.blob.digest, SIDE_NAME) == source.get_side(m.blob.digest, SIDE_NAME)
