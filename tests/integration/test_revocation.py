"""Keys rotate and revoke (issue 22, point 4): a signed revocation list in the registry, read on
every fetch and start, kept in the store; `prebake revoke` writes it. CLI paths are subprocesses."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from prebake.artifacts.ports.errors import RegistryUnavailable
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.policy_file import load_policy
from prebake.registry.trust.revocation import LIST_NAME, RevocationList, Revocations, sign_list
from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair
from tests.support.baking import Home
from tests.support.seeding import plan_here, seed


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """A registry of tiny-llama bundles signed by `ci`; a revocation key `revoker`; a policy naming both."""
    root = tmp_path_factory.mktemp("revocation")
    keys = {}
    for name in ("ci", "revoker", "mallory"):
        private, public = write_keypair(name, root / "keys")
        keys[name] = (private, public.read_text().strip(), KeySigner(name, load_private_key(private)))
    manifests = seed(root / "registry", root / "scratch", plan_here(), sign=keys["ci"][2])
    return root, keys, manifests


def _policy(root, keys, name: str, on_unreadable: str = "fail-closed", max_age_hours: float = 24) -> str:
    path = root / f"{name}.toml"
    path.write_text(
        f'version = 1\n[keys.ci]\nkey = "{keys["ci"][1]}"\n[keys.revoker]\nkey = "{keys["revoker"][1]}"\n'
        '[[rules]]\nkeys = ["ci"]\n'
        f'[revocation]\nkeys = ["revoker"]\non_unreadable = "{on_unreadable}"\nmax_age_hours = {max_age_hours}\n'
    )
    return str(path)


def _registry(tmp_path, fleet):
    """A private copy of the fleet's registry, so each test writes its own revocation list."""
    import shutil

    copy = tmp_path / "registry"
    shutil.copytree(fleet[0] / "registry", copy)
    return copy


def _fetch(home: Home, registry, policy: str) -> tuple[int, dict]:
    done = home.prebake(
        "fetch", "--model", "tiny-llama", "--precision", "bf16", "--registry", str(registry), "--json",
        extra_env={"PREBAKE_POLICY": policy},
    )  # fmt: skip
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {"stderr": done.stderr}


def _revoke(home: Home, registry, keys, *args: str, signer: str = "revoker"):
    return home.prebake("revoke", "--registry", str(registry), "--signing-key", str(keys[signer][0]), *args)


def test_revoking_a_bundle_already_in_a_nodes_store_stops_its_next_start(tmp_path, fleet):
    root, keys, manifests = fleet
    registry = _registry(tmp_path, fleet)
    node = Home(tmp_path / "node")
    assert _revoke(node, registry, keys).returncode == 0  # the first, empty list
    code, first = _fetch(node, registry, _policy(root, keys, "p1"))
    assert code == 0, first
    revoked = manifests["buckets"].blob.digest
    said = _revoke(node, registry, keys, "--bundle", revoked, "--reason", "bad bucket set")
    assert said.returncode == 0 and "serial 2" in said.stdout, said.stderr
    code, again = _fetch(node, registry, _policy(root, keys, "p1"))
    assert code == 2
    (miss,) = [m for m in again["misses"] if m["kind"] == "buckets"]
    assert f"bundle blob {revoked[:23]} is revoked (bad bucket set) by the revocation list serial 2" in miss["reason"]
    assert "the store's buckets bundle" in miss["reason"]  # it was in the store: not used
    served = node.prebake(
        "serve", "--model", "tiny-llama", "--precision", "bf16", "--registry", str(registry),
        "--on-miss", "fail", "--eager", "--port", "0", extra_env={"PREBAKE_POLICY": _policy(root, keys, "p1")},
    )  # fmt: skip
    assert served.returncode != 0 and "is revoked" in served.stderr and "warm-up" not in served.stderr


def test_a_revoked_key_signs_nothing_any_more(tmp_path, fleet):
    root, keys, _manifests = fleet
    registry = _registry(tmp_path, fleet)
    node = Home(tmp_path / "node")
    assert _revoke(node, registry, keys, "--key", "ci", "--reason", "leaked").returncode == 0
    code, got = _fetch(node, registry, _policy(root, keys, "p2"))
    assert code == 2 and all("its signing key ci is revoked (leaked)" in m["reason"] for m in got["misses"])


def test_a_list_signed_by_a_key_the_policy_does_not_name_is_forged(tmp_path, fleet):
    root, keys, _m = fleet
    registry = _registry(tmp_path, fleet)
    node = Home(tmp_path / "node")
    assert _revoke(node, registry, keys, signer="mallory").returncode == 0
    code, got = _fetch(node, registry, _policy(root, keys, "p3"))
    assert code == 2 and all("is refused (forged or corrupt)" in m["reason"] for m in got["misses"])
    assert all("fail-closed" in m["reason"] for m in got["misses"])


def test_a_missing_list_is_a_policy_choice_fail_closed_or_fail_open(tmp_path, fleet):
    root, keys, _m = fleet
    registry = _registry(tmp_path, fleet)
    node = Home(tmp_path / "node")
    code, got = _fetch(node, registry, _policy(root, keys, "closed"))
    assert code == 2 and all("it is missing" in m["reason"] for m in got["misses"])
    code, got = _fetch(node, registry, _policy(root, keys, "open", on_unreadable="fail-open"))
    assert code == 0 and got["complete"]


def _revocations(tmp_path, fleet, registry_dir, **kw) -> Revocations:
    root, keys, _m = fleet
    policy = load_policy(_policy(root, keys, "unit"))
    opener = kw.pop("open_registry", lambda: FileRegistry(registry_dir))
    return Revocations(policy, str(registry_dir), tmp_path / "home", opener, **kw)


def _publish(registry_dir, signers, serial: int, issued: dt.datetime, signer: str = "revoker", **entries) -> None:
    FileRegistry(registry_dir).put_meta(
        LIST_NAME, sign_list(RevocationList(serial=serial, issued=issued, **entries), signers[signer][2])
    )


def test_a_stale_list_is_refused(tmp_path, fleet):
    registry = _registry(tmp_path, fleet)
    _publish(registry, fleet[1], 1, dt.datetime.now(dt.UTC) - dt.timedelta(hours=30))
    state = _revocations(tmp_path, fleet, registry).state()
    assert isinstance(state, str) and "is stale: 30 h old, more than max_age_hours = 24" in state


def test_a_list_rolled_back_to_an_older_serial_is_refused(tmp_path, fleet):
    registry = _registry(tmp_path, fleet)
    now = dt.datetime.now(dt.UTC)
    _publish(registry, fleet[1], 5, now, bundles=("sha256:" + "1" * 64,))
    assert isinstance(_revocations(tmp_path, fleet, registry).state(), RevocationList)  # the node keeps serial 5
    _publish(registry, fleet[1], 4, now)  # an attacker restores an older list without the entry
    state = _revocations(tmp_path, fleet, registry).state()
    assert isinstance(state, str) and "serial 4) is older than the one this node holds (serial 5)" in state


def test_when_the_registry_does_not_answer_the_stored_copy_stands_in_until_it_expires(tmp_path, fleet):
    registry = _registry(tmp_path, fleet)
    _publish(registry, fleet[1], 1, dt.datetime.now(dt.UTC), keys=("old-ci",))
    assert isinstance(_revocations(tmp_path, fleet, registry).state(), RevocationList)

    def down():
        raise RegistryUnavailable("the registry is down")

    offline = _revocations(tmp_path, fleet, registry, open_registry=down).state()
    assert isinstance(offline, RevocationList) and offline.keys == ("old-ci",)
    store_copy = next((tmp_path / "home" / "revocations").iterdir())
    old = store_copy.stat().st_mtime - 7200
    import os

    os.utime(store_copy, (old, old))  # read two hours ago: past cache_seconds (3600)
    expired = _revocations(tmp_path, fleet, registry, open_registry=down).state()
    assert isinstance(expired, str) and "could not be read" in expired and "copy has expired" in expired


def test_prebake_revoke_needs_a_key_and_a_digest_it_understands(tmp_path, fleet):
    registry = _registry(tmp_path, fleet)
    node = Home(tmp_path / "node")
    no_key = node.prebake("revoke", "--registry", str(registry), "--key", "ci")
    assert no_key.returncode == 2 and "--signing-key PEM or PREBAKE_SIGNING_KEY" in no_key.stderr
    bad = _revoke(node, registry, fleet[1], "--bundle", "abc")
    assert bad.returncode == 2 and "is not a blob digest" in bad.stderr
    assert FileRegistry(registry).get_meta(LIST_NAME) is None  # nothing was written
