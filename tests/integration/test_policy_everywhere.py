"""The policy in force decides on every path, whatever installed a bundle (issue 22, point 1).

The operator's story: a node fetched while PREBAKE_TRUSTED_KEYS was unset (installed
unverified), then the fleet's key was set. From then on no path uses the unsigned trees:
`prebake fetch` (bundled and --engine vllm) exits 2 naming the stored bundle, the policy's
reason and the fix, and fetches a bundle the policy accepts when a registry has one; the
bundled engine's start does not use them; `prebake gc` counts them as garbage, not in use; a
bake does not adopt a refused registry entry. CLI paths run as real `prebake` subprocesses.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.bake.tasks import _published
from prebake.artifacts.fetch.gate import policy_refuses
from prebake.artifacts.fetch.outcome import Miss, StoreRefused
from prebake.artifacts.fetch.pipeline import Source, fetch_key, lookup, resolve
from prebake.artifacts.ports.errors import UntrustedEntryError
from prebake.artifacts.store.local import Installed, Store
from prebake.registry import open_registry
from prebake.registry.trust.signing import KeySigner, TrustPolicy, load_private_key, write_keypair
from tests.support.baking import Home
from tests.support.seeding import plan_here, seed

MODEL, PRECISION = "tiny-llama", "bf16"


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> tuple[KeySigner, str]:
    folder = tmp_path_factory.mktemp("keys")
    private, public = write_keypair("fleet", folder)
    return KeySigner("fleet", load_private_key(private)), public.read_text().strip()


@pytest.fixture(scope="module")
def registries(tmp_path_factory, keys):
    """Two folder registries for this host's tiny-llama keys: one unsigned, one signed by the fleet key."""
    signer, _line = keys
    root = tmp_path_factory.mktemp("registries")
    plan = plan_here(MODEL, PRECISION)
    unsigned = seed(root / "unsigned", root / "scratch-u", plan, build="unsigned")
    signed = seed(root / "signed", root / "scratch-s", plan, sign=signer, build="signed")
    return plan, root / "unsigned", root / "signed", unsigned, signed


def _fetch(home: Home, registry: Path, trusted: str, *extra: str) -> subprocess.CompletedProcess:
    return home.prebake(
        "fetch", "--model", MODEL, "--precision", PRECISION, "--registry", str(registry), "--json", *extra,
        extra_env={"PREBAKE_TRUSTED_KEYS": trusted},
    )  # fmt: skip


def _installed_unverified(tmp_path: Path, registry: Path) -> Home:
    home = Home(tmp_path)
    first = _fetch(home, registry, "")
    assert first.returncode == 0, first.stderr
    assert "UNVERIFIED" in first.stderr
    return home


def test_prebake_fetch_refuses_bundles_stored_under_an_old_policy(tmp_path, registries, keys):
    _plan, unsigned_registry, _signed_registry, _u, _s = registries
    home = _installed_unverified(tmp_path, unsigned_registry)
    again = _fetch(home, unsigned_registry, keys[1])
    assert again.returncode == 2, again.stdout + again.stderr
    payload = json.loads(again.stdout)
    assert payload["complete"] is False and not payload["env"] and not payload["bundles"]  # no unsigned tree exported
    reasons = " ".join(m["reason"] for m in payload["misses"])
    assert "the store's buckets bundle" in reasons and "refused by the trust policy in force" in reasons
    assert "unsigned" in reasons and "fleet" in reasons  # the policy's reason names the trusted key
    assert "prebake store rm" in reasons and "prebake promote" in reasons  # the fix
    assert all(m["refused"] and m["reason_class"] == "untrusted" for m in payload["misses"])


def test_prebake_fetch_replaces_a_refused_stored_bundle_from_a_registry_that_has_an_accepted_one(
    tmp_path, registries, keys
):
    _plan, unsigned_registry, signed_registry, _u, signed = registries
    home = _installed_unverified(tmp_path, unsigned_registry)
    got = _fetch(home, signed_registry, keys[1])
    assert got.returncode == 0, got.stderr
    bundles = json.loads(got.stdout)["bundles"]
    assert {k: b["blob"] for k, b in bundles.items()} == {k: m.blob.digest for k, m in signed.items()}
    assert "refused by the trust policy in force" in got.stderr and "replaced by the registry's bundle" in got.stderr
    store = Store(home.root / "home")
    for kind, manifest in signed.items():  # the store's entry is now the signed one
        hit = store.lookup(kind, manifest.key_digest)
        assert hit is not None and hit.manifest.signatures and hit.manifest.blob == manifest.blob
    third = _fetch(home, unsigned_registry, keys[1])  # the signed bundles now serve from the store
    assert third.returncode == 0 and "refused" not in third.stderr


def test_prebake_fetch_engine_vllm_refuses_bundles_stored_under_an_old_policy(tmp_path, keys):
    plan = plan_here("tiny-llama-vllm", PRECISION)
    registry = tmp_path / "registry"
    seed(registry, tmp_path / "scratch", plan, build="unsigned")
    home = Home(tmp_path / "node")
    argv = ("fetch", "--engine", "vllm", "--model", "tiny-llama-vllm", "--precision", PRECISION)
    argv += ("--registry", str(registry), "--json", "--cache-root", str(tmp_path / "cache"))
    first = home.prebake(*argv, extra_env={"PREBAKE_TRUSTED_KEYS": ""})
    store = Store(home.root / "home")
    assert all(store.lookup(k, plan.key(k).digest) is not None for k in plan.kinds.names), first.stderr
    again = home.prebake(*argv, extra_env={"PREBAKE_TRUSTED_KEYS": keys[1]})
    assert again.returncode == 2, again.stdout + again.stderr
    payload = json.loads(again.stdout)
    trees = str(home.root / "home" / "trees")
    assert payload["complete"] is False and not any(trees in v for v in payload["env"].values())
    assert {m["kind"] for m in payload["misses"]} == set(plan.kinds.names)
    assert all("refused by the trust policy in force" in m["reason"] for m in payload["misses"])


def test_bundled_serve_does_not_start_from_a_refused_stored_bundle(tmp_path, registries, keys):
    _plan, unsigned_registry, _signed, _u, _s = registries
    home = _installed_unverified(tmp_path, unsigned_registry)
    served = home.prebake(
        "serve", "--model", MODEL, "--precision", PRECISION, "--registry", str(unsigned_registry),
        "--on-miss", "fail", "--eager", "--port", "0",
        extra_env={"PREBAKE_TRUSTED_KEYS": keys[1]}, timeout=300,
    )  # fmt: skip
    log = served.stdout + served.stderr
    assert served.returncode != 0, log
    assert "stored bundle(s) refused by the trust policy in force" in log
    assert "the store's buckets bundle" in log and "--on-miss is fail" in log
    assert "warm-up" not in log and "prebake serve: load" not in log  # nothing of it was used


def test_gc_counts_refused_bundles_as_garbage_not_in_use(tmp_path, registries, keys):
    _plan, unsigned_registry, _signed, unsigned, _s = registries
    home = _installed_unverified(tmp_path, unsigned_registry)
    roomy = home.prebake("gc", "--max-size", "10G", "--json", extra_env={"PREBAKE_TRUSTED_KEYS": ""})
    assert roomy.returncode == 0 and json.loads(roomy.stdout)["evicted"] == []  # no policy: nothing is garbage
    dry = home.prebake("gc", "--max-size", "10G", "--dry-run", "--json", extra_env={"PREBAKE_TRUSTED_KEYS": keys[1]})
    assert sorted(json.loads(dry.stdout)["evicted"]) == sorted(m.blob.digest for m in unsigned.values())
    gone = home.prebake("gc", "--max-size", "10G", extra_env={"PREBAKE_TRUSTED_KEYS": keys[1]})
    assert gone.returncode == 0 and "refused" in gone.stdout and "by the trust policy in force" in gone.stdout
    store = Store(home.root / "home")
    assert all(store.lookup(k, m.key_digest) is None for k, m in unsigned.items())


def test_gc_under_a_policy_keeps_what_it_accepts(tmp_path, registries, keys):
    _plan, _u, signed_registry, _unsigned, signed = registries
    home = Home(tmp_path)
    assert _fetch(home, signed_registry, keys[1]).returncode == 0
    kept = home.prebake("gc", "--max-size", "10G", "--json", extra_env={"PREBAKE_TRUSTED_KEYS": keys[1]})
    assert json.loads(kept.stdout)["evicted"] == [] and json.loads(kept.stdout)["refused"] == []


# -- in process: the pipeline's own steps ---------------------------------------------------------


def _policy(keys) -> TrustPolicy:
    return TrustPolicy.from_lines([keys[1]])


def test_lookup_never_asks_the_store_twice_a_refused_hit_goes_to_the_registry(tmp_path, registries, keys):
    plan, unsigned_registry, signed_registry, _u, signed = registries
    store = Store(tmp_path / "node")
    assert resolve(plan, store=store, source=Source(str(unsigned_registry), None, open_registry)).complete
    trust = _policy(keys).check
    looked = lookup(
        plan, plan.kinds.names, store=store, source=Source(str(unsigned_registry), trust, open_registry), timeout=10
    )
    assert set(looked.store_refused) == set(plan.kinds.names)
    assert not any(isinstance(v, Installed) for v in looked.found.values())  # the bug: the old code used these
    got = resolve(plan, store=store, source=Source(str(signed_registry), trust, open_registry))
    assert got.complete and {k: i.manifest.blob for k, i in got.installed.items()} == {
        k: m.blob for k, m in signed.items()
    }
    assert len(got.notes) == len(plan.kinds.names)


def test_policy_refuses_is_a_signature_check_not_a_rehash(tmp_path, registries, keys):
    plan, unsigned_registry, _s, _u, _signed = registries
    store = Store(tmp_path / "node")
    resolve(plan, store=store, source=Source(str(unsigned_registry), None, open_registry))
    hit = store.lookup("buckets", plan.key("buckets").digest)
    assert hit is not None
    for path in hit.tree.rglob("*"):  # the tree's own check is at install; the policy reads the manifest only
        if path.is_file():
            path.chmod(0)
    try:
        refused = policy_refuses(hit, _policy(keys).check)
        assert isinstance(refused, StoreRefused) and "unsigned" in refused.why
        assert policy_refuses(hit, None) is None
    finally:
        for path in hit.tree.rglob("*"):
            path.chmod(0o644)


def test_fetch_of_one_key_names_the_refused_stored_bundle(tmp_path, registries, keys):
    plan, unsigned_registry, _s, _u, _signed = registries
    store = Store(tmp_path / "node")
    registry = open_registry(str(unsigned_registry))
    assert isinstance(fetch_key(store, registry, plan.key("buckets")), Installed)
    got = fetch_key(store, registry, plan.key("buckets"), trust=_policy(keys).check)
    assert isinstance(got, Miss) and got.refused and "the store's buckets bundle" in got.reason


def test_a_bake_does_not_adopt_a_registry_entry_the_policy_refuses(tmp_path, registries, keys):
    plan, unsigned_registry, _s, _u, _signed = registries
    registry = open_registry(str(unsigned_registry))
    trust = _policy(keys).check
    assert not _published(registry, "buckets", plan.key("buckets").digest, trust)()  # not up to date
    assert _published(registry, "buckets", plan.key("buckets").digest, None)()
    with pytest.raises(UntrustedEntryError, match="refuses it: unsigned.*prebake verify --quarantine"):
        bake_kind(plan, "buckets", store=Store(tmp_path / "baker"), registry=registry, sign=keys[0], trust=trust)
    assert Store(tmp_path / "baker").lookup("buckets", plan.key("buckets").digest) is None


def test_the_fleet_plan_counts_a_refused_entry_as_missing(tmp_path, registries, keys, monkeypatch):
    from prebake.engine.fleet.plan import make_plan

    _plan, unsigned_registry, _s, _u, _signed = registries
    monkeypatch.setenv("PREBAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PREBAKE_TRUSTED_KEYS", "")
    target = _plan.target.name
    before = make_plan(MODEL, precision=PRECISION, tp=None, registry=str(unsigned_registry), profiles=None)
    monkeypatch.setenv("PREBAKE_TRUSTED_KEYS", keys[1])
    after = make_plan(MODEL, precision=PRECISION, tp=None, registry=str(unsigned_registry), profiles=None)
    assert before.find(target).status == "present"
    assert after.find(target).status == "missing"
