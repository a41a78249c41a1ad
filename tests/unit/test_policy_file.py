"""Policies an operator writes (issue 22, point 3): keys per registry prefix and model, builders,
dependency constraints, maximum age, unsigned only where said; every refusal names the rule."""

from __future__ import annotations

import datetime as dt
import textwrap
from pathlib import Path

import pytest

from prebake.artifacts.bake.bake_kind import bake_kind
from prebake.artifacts.bake.provenance import SIDE_NAME
from prebake.artifacts.store.local import Store
from prebake.engine.common.builder import attester, host_versions
from prebake.engine.common.probe import current_host
from prebake.registry.backends.file import FileRegistry
from prebake.registry.trust.policy import FilePolicy
from prebake.registry.trust.policy_file import PolicyError, load_policy
from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair
from tests.support.seeding import plan_here

BUILDER = "https://github.com/acme/models/.github/workflows/bake.yml@refs/heads/main"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """buckets baked and attested by key `ci` (builder BUILDER) into a folder registry; and key `other`."""
    root = tmp_path_factory.mktemp("policy")
    lines = {}
    signers = {}
    for name in ("ci", "other"):
        private, public = write_keypair(name, root / "keys")
        lines[name] = public.read_text().strip()
        signers[name] = KeySigner(name, load_private_key(private))
    registry = FileRegistry(root / "registry")
    attest = attester(signers["ci"], current_host(), {"PREBAKE_BUILDER_ID": BUILDER})
    baked = bake_kind(
        plan_here(), "buckets", store=Store(root / "home"), registry=registry, sign=signers["ci"], attest=attest
    )
    return root, lines, signers, registry, baked.manifest


def _policy(root: Path, text: str, lines: dict[str, str]) -> Path:
    keys = "".join(f'[keys.{n}]\nkey = "{line}"\n' for n, line in lines.items())
    path = root / f"policy-{abs(hash(text))}.toml"
    path.write_text("version = 1\n" + keys + textwrap.dedent(text))
    return path


def _bind(world, text: str, **kw) -> FilePolicy:
    root, lines, _signers, registry, _manifest = world
    path = _policy(root, text, lines)
    attestation = lambda m: registry.get_side(m.blob.digest, SIDE_NAME)  # noqa: E731
    return FilePolicy(load_policy(path), str(path), registry.url, host_versions(current_host()), attestation, **kw)


def test_a_rule_requiring_the_builder_and_the_nodes_torch_accepts_what_ci_built(world):
    manifest = world[4]
    policy = _bind(world, f'[[rules]]\nkeys = ["ci"]\nbuilders = ["{BUILDER}"]\n[rules.dependencies]\ntorch = "host"\n')
    assert policy(manifest) is None


def test_a_builder_the_policy_does_not_name_is_refused_naming_the_rule(world):
    policy = _bind(world, '[[rules]]\nmodel = "tiny-*"\nkeys = ["ci"]\nbuilders = ["https://ci.acme.example/*"]\n')
    why = policy(world[4])
    assert why is not None and "rule 1 (registry *, model tiny-*)" in why
    assert f"built by {BUILDER!r}, which is not one of the accepted builders" in why


def test_a_builder_prefix_ending_in_a_star_accepts_every_ref_under_it(world):
    policy = _bind(world, '[[rules]]\nkeys = ["ci"]\nbuilders = ["https://github.com/acme/models/*"]\n')
    assert policy(world[4]) is None


def test_dependency_constraints_are_checked_against_the_provenance(world):
    torch = current_host().software.torch
    assert _bind(world, f'[[rules]]\nkeys = ["ci"]\n[rules.dependencies]\ntorch = "=={torch}"\n')(world[4]) is None
    why = _bind(world, '[[rules]]\nkeys = ["ci"]\n[rules.dependencies]\ntorch = ">=99"\n')(world[4])
    assert why is not None and f"built with torch {torch}, which does not satisfy torch '>=99'" in why
    text = '[[rules]]\nkeys = ["ci"]\n[rules.dependencies]\ntorch = "host"\n'
    root, lines, _s, registry, manifest = world
    path = _policy(root, text, lines)
    other_node = FilePolicy(
        load_policy(path), str(path), registry.url, {"torch": "2.14.1+cu128"},
        lambda m: registry.get_side(m.blob.digest, SIDE_NAME),
    )  # fmt: skip
    why = other_node(manifest)
    assert why is not None and f"built with torch {torch}, this node has torch 2.14.1+cu128" in why
    why = _bind(world, '[[rules]]\nkeys = ["ci"]\n[rules.dependencies]\nneuron = ">=1"\n')(manifest)
    assert why is not None and "its provenance names no neuron" in why


def test_a_rule_requiring_provenance_refuses_a_bundle_without_an_attestation(world):
    root, lines, _s, registry, manifest = world
    path = _policy(root, '[[rules]]\nkeys = ["ci"]\nrequire_provenance = true\n', lines)
    policy = FilePolicy(load_policy(path), str(path), registry.url, {}, lambda m: None)
    why = policy(manifest)
    assert why is not None and "requires a provenance attestation beside blob" in why


def test_an_old_bundle_is_refused_past_max_age(world):
    later = lambda: dt.datetime.now(dt.UTC) + dt.timedelta(days=40)  # noqa: E731
    policy = _bind(world, '[[rules]]\nkeys = ["ci"]\nmax_age_days = 30\n', now=later)
    why = policy(world[4])
    assert why is not None and "older than max_age_days = 30" in why
    assert _bind(world, '[[rules]]\nkeys = ["ci"]\nmax_age_days = 30\n')(world[4]) is None


def test_an_expired_key_signs_nothing(world):
    root, lines, _s, registry, manifest = world
    path = root / "expired.toml"
    path.write_text(
        f'version = 1\n[keys.ci]\nkey = "{lines["ci"]}"\nnot_after = 2026-01-01T00:00:00Z\n[[rules]]\nkeys = ["ci"]\n'
    )
    why = FilePolicy(load_policy(path), str(path), registry.url)(manifest)
    assert why is not None and "key ci signed it but is valid always .. 2026-01-01" in why and "not now" in why


def test_keys_rotate_two_keys_at_once_and_a_key_not_in_the_rule_is_refused(world):
    assert _bind(world, '[[rules]]\nkeys = ["other", "ci"]\n')(world[4]) is None
    why = _bind(world, '[[rules]]\nkeys = ["other"]\n')(world[4])
    assert (
        why is not None and "signed by ci, and no signature verifies against the keys this rule trusts (other)" in why
    )


def test_unsigned_bundles_pass_only_where_a_rule_allows_them(world):
    root, lines, _s, registry, manifest = world
    unsigned = manifest.model_copy(update={"signatures": ()})
    text = '[[rules]]\nregistry = "file://"\nallow_unsigned = true\n[[rules]]\nkeys = ["ci"]\n'
    assert _bind(world, text)(unsigned) is None
    path = _policy(root, text, lines)
    elsewhere = FilePolicy(load_policy(path), str(path), "s3://acme/prod")
    why = elsewhere(unsigned)
    assert why is not None and "rule 2 (registry *, model *): unsigned" in why


def test_no_matching_rule_is_a_refusal_that_says_so(world):
    why = _bind(world, '[[rules]]\nregistry = "s3://acme/"\nkeys = ["ci"]\n')(world[4])
    assert why is not None and "no rule covers registry file://" in why


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[rules]]\nkeys = ["ci"\n', "is not valid TOML.*line"),
        ('[[rules]]\nkeys = ["ci"]\nbuilder = ["x"]\n', r"line 6: rules\[0\]\.builder: unknown field; remove it"),
        ('[[rules]]\nkeys = ["nobody"]\n', r"rules\[0\] names key 'nobody', which \[keys\] does not define"),
        (
            '[[rules]]\nkeys = ["ci"]\n[rules.dependencies]\ntorch = "two-point-thirteen"\n',
            "neither 'host' nor a version",
        ),
        ("[[rules]]\n", "names the keys that may sign"),
        ("", r"rules: required field is missing; add it"),
    ],
)
def test_a_malformed_policy_is_a_clear_error_naming_the_field(world, body, message, tmp_path):
    lines = world[1]
    path = tmp_path / "policy.toml"
    path.write_text(f'version = 1\n[keys.ci]\nkey = "{lines["ci"]}"\n' + body)
    with pytest.raises(PolicyError, match=message):
        load_policy(path)


def test_a_key_line_whose_name_disagrees_with_its_table_is_refused(world, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(f'version = 1\n[keys.fleet]\nkey = "{world[1]["ci"]}"\n[[rules]]\nkeys = ["fleet"]\n')
    with pytest.raises(PolicyError, match="keys.fleet: its key line is named 'ci'"):
        load_policy(path)
