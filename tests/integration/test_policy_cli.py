"""PREBAKE_POLICY at fetch and `prebake verify --policy FILE`, as an operator runs them (subprocesses)."""

from __future__ import annotations

import json

import pytest

from prebake.engine.common.builder import attester
from prebake.engine.common.probe import current_host
from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair
from tests.support.baking import Home
from tests.support.seeding import plan_here, seed

BUILDER = "https://github.com/acme/models/.github/workflows/bake.yml@refs/heads/main"


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy-cli")
    private, public = write_keypair("ci", root / "keys")
    signer = KeySigner("ci", load_private_key(private))
    attest = attester(signer, current_host(), {"PREBAKE_BUILDER_ID": BUILDER})
    seed(root / "registry", root / "scratch", plan_here(), sign=signer, attest=attest)
    return root, public.read_text().strip()


def _policy(root, line: str, builders: str, name: str):
    path = root / f"{name}.toml"
    path.write_text(
        f'version = 1\n[keys.ci]\nkey = "{line}"\n'
        f'[[rules]]\nmodel = "tiny-*"\nkeys = ["ci"]\nbuilders = ["{builders}"]\n'
        '[rules.dependencies]\ntorch = "host"\n'
    )
    return path


def test_fetch_under_a_policy_file_refuses_another_builder_naming_the_rule_and_accepts_its_own(signed, tmp_path):
    root, line = signed
    home = Home(tmp_path)
    wrong = _policy(root, line, "https://ci.acme.example/*", "wrong")
    argv = ("fetch", "--model", "tiny-llama", "--precision", "bf16", "--registry", str(root / "registry"), "--json")
    refused = home.prebake(*argv, extra_env={"PREBAKE_POLICY": str(wrong)})
    assert refused.returncode == 2, refused.stderr
    reasons = [m["reason"] for m in json.loads(refused.stdout)["misses"]]
    assert reasons and all(f"policy {wrong} rule 1 (registry *, model tiny-*)" in r for r in reasons)
    assert all(f"built by '{BUILDER}'" in r for r in reasons)
    right = _policy(root, line, "https://github.com/acme/models/*", "right")
    accepted = home.prebake(*argv, extra_env={"PREBAKE_POLICY": str(right)})
    assert accepted.returncode == 0, accepted.stderr
    assert set(json.loads(accepted.stdout)["bundles"]) == {"buckets", "autotune", "graphs"}
    store_copy = list((tmp_path / "home" / "side").rglob("provenance.intoto.dsse.json"))
    assert len(store_copy) == 3  # kept in the store: the next start checks it there
    again = home.prebake(*argv, extra_env={"PREBAKE_POLICY": str(wrong)})  # the store's copies, under the new policy
    assert again.returncode == 2 and "refused by the trust policy in force" in again.stdout


def test_verify_with_a_policy_file_reports_each_entry_and_the_rule(signed, tmp_path):
    root, line = signed
    home = Home(tmp_path)
    wrong = _policy(root, line, "https://ci.acme.example/*", "wrong-v")
    bad = home.prebake("verify", "--registry", str(root / "registry"), "--policy", str(wrong))
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.count("BAD ") == 3 and "rule 1 (registry *, model tiny-*)" in bad.stdout
    right = _policy(root, line, BUILDER, "right-v")
    good = home.prebake("verify", "--registry", str(root / "registry"), "--policy", str(right))
    assert good.returncode == 0, good.stdout + good.stderr
    broken = root / "broken.toml"
    broken.write_text('version = 1\n[[rules]]\nkeys = ["ci"]\nbuilder = []\n')
    said = home.prebake("verify", "--registry", str(root / "registry"), "--policy", str(broken))
    assert said.returncode == 2 and "rules[0].builder: unknown field" in said.stderr
