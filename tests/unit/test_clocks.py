"""A node whose clock is a day ahead or behind (docs/trust-and-failure.md, "Clocks"): key validity, bundle
age, revocation freshness and quarantine ages are decided by the clock of the node that decides (the
reader's for trust, the pruner's for ages), as documented, and each refusal names that clock.

Each check takes its clock as `now` (FilePolicy.now, Revocations.now, prune(now=...)); the tests set it.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import replace

import pytest

from prebake.registry.backends.file import FileRegistry
from prebake.registry.review.aging import CLOCK_SKEW, prune
from prebake.registry.trust.policy import FilePolicy
from prebake.registry.trust.policy_file import load_policy
from prebake.registry.trust.revocation import LIST_NAME, RevocationList, Revocations, sign_list
from prebake.registry.trust.signing import KeySigner, load_private_key, write_keypair
from tests.support.bundles import make_bundle

TRUE_NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)  # the fleet's time; make_bundle stamps 2026-11-29T12:00Z
DAY = dt.timedelta(days=1)
SKEWS = {"right": dt.timedelta(0), "a-day-ahead": DAY, "a-day-behind": -DAY}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("clocks")
    keys = {}
    for name in ("ci", "revoker"):
        private, public = write_keypair(name, root / "keys")
        keys[name] = (public.read_text().strip(), KeySigner(name, load_private_key(private)))
    bundle = make_bundle(root / "bake")
    registry = FileRegistry(root / "registry")
    manifest = keys["ci"][1](bundle.manifest)
    registry.publish(manifest, bundle.blob)
    return root, keys, registry, manifest


def _policy(world, name: str, key_extra: str = "", rule_extra: str = "", revocation: bool = False) -> FilePolicy:
    root, keys, registry, _m = world
    text = f'version = 1\n[keys.ci]\nkey = "{keys["ci"][0]}"\n{key_extra}'
    text += f'[keys.revoker]\nkey = "{keys["revoker"][0]}"\n[[rules]]\nkeys = ["ci"]\n{rule_extra}'
    if revocation:
        text += '[revocation]\nkeys = ["revoker"]\nmax_age_hours = 24\n'
    path = root / f"{name}.toml"
    path.write_text(text)
    return FilePolicy(load_policy(path), str(path), registry.url)


def _at(skew: dt.timedelta):
    return lambda: TRUE_NOW + skew


@pytest.mark.parametrize("clock", SKEWS)
def test_key_validity_is_decided_by_this_nodes_clock_and_a_refusal_names_it(world, clock):
    """The key is valid until 12 h after the fleet's time: a node a day ahead is past it and refuses,
    naming its own clock; a node a day behind is before a key that starts 12 h before the fleet's time."""
    until = _policy(world, f"until-{clock}", key_extra=f"not_after = {(TRUE_NOW + DAY / 2):%Y-%m-%dT%H:%M:%SZ}\n")
    since = _policy(world, f"since-{clock}", key_extra="not_before = 2026-11-01T00:00:00Z\n")
    manifest = world[3]
    node = _at(SKEWS[clock])
    why_until = replace(until, now=node)(manifest)
    assert replace(since, now=node)(manifest) is None  # a long-valid key: any clock
    if clock == "a-day-ahead":
        assert why_until is not None and "not now (2026-12-02 12:00 UTC by this node's clock" in why_until
        assert "set it right (NTP)" in why_until
    else:
        assert why_until is None


@pytest.mark.parametrize("clock", SKEWS)
def test_a_key_starting_within_the_day_is_not_yet_valid_on_a_node_a_day_behind(world, clock):
    """The key starts 12 h before the fleet's time and signed a bundle made an hour ago: a node a day
    behind is before the key's period and refuses, naming its own clock."""
    fresh = world[3].model_copy(update={"created": f"{TRUE_NOW - dt.timedelta(hours=1):%Y-%m-%dT%H:%M:%SZ}"})
    signed = world[1]["ci"][1](fresh.model_copy(update={"signatures": ()}))
    start = f"not_before = {(TRUE_NOW - DAY / 2):%Y-%m-%dT%H:%M:%SZ}\n"
    policy = replace(_policy(world, f"start-{clock}", key_extra=start), now=_at(SKEWS[clock]))
    why = policy(signed)
    if clock == "a-day-behind":
        assert why is not None and "not now (2026-11-30 12:00 UTC by this node's clock" in why
    else:
        assert why is None


@pytest.mark.parametrize("clock", SKEWS)
def test_bundle_age_is_counted_on_this_nodes_clock(world, clock):
    """max_age_days = 3 and a bundle made 2 days before the fleet's time: a node a day ahead sees 3 days."""
    policy = _policy(world, f"age-{clock}", rule_extra="max_age_days = 2.5\n")
    why = replace(policy, now=_at(SKEWS[clock]))(world[3])
    if clock == "a-day-ahead":
        assert why is not None and "3 days ago (2026-12-02 12:00 UTC by this node's clock" in why
    else:
        assert why is None


def _revocations(world, tmp_path, clock: str, issued: dt.datetime) -> Revocations:
    root, keys, registry, _m = world
    copy = FileRegistry(tmp_path / "registry")
    copy.put_meta(LIST_NAME, sign_list(RevocationList(serial=1, issued=issued), keys["revoker"][1]))
    policy = _policy(world, f"rev-{clock}", revocation=True).policy
    return Revocations(policy, str(copy.root), tmp_path / "home", lambda: copy, now=_at(SKEWS[clock]))


@pytest.mark.parametrize("clock", SKEWS)
def test_revocation_freshness_is_decided_by_this_nodes_clock(world, tmp_path, clock, caplog):
    """A list issued 2 h before the fleet's time, max_age_hours = 24: a node a day ahead finds it stale
    (and, fail-closed, refuses with the clock named); a node a day behind uses it and warns once that its
    clock is behind (a list only takes trust away, so a list from its future is still applied)."""
    revocations = _revocations(world, tmp_path, clock, TRUE_NOW - dt.timedelta(hours=2))
    with caplog.at_level(logging.WARNING, logger="prebake.trust"):
        state = revocations.state()
    if clock == "a-day-ahead":
        assert (
            isinstance(state, str)
            and "is stale: 26 h old, more than max_age_hours = 24 (2026-12-02 12:00 UTC by this node's clock)" in state
        )
        refusal = revocations(world[3], "ci")
        assert refusal is not None and "fail-closed" in refusal and "by this node's clock" in refusal
    else:
        assert isinstance(state, RevocationList) and revocations(world[3], "ci") is None
    behind = "this node's clock is behind" in caplog.text
    assert behind == (clock == "a-day-behind"), caplog.text


@pytest.mark.parametrize("clock", SKEWS)
def test_quarantine_ages_are_counted_on_the_pruners_clock(world, tmp_path, clock):
    """A write-back stamped by a pod 2 days before the fleet's time, pruned at 2.5 days: a pruner a day
    ahead removes it (3 days old by its clock); a pruner a day behind keeps it; a pod's stamp more than
    CLOCK_SKEW ahead of the pruner's clock counts as expired, and the reason names the pruner's clock."""
    quarantine = FileRegistry(tmp_path / "incoming")
    quarantine.publish(world[3], make_bundle(tmp_path / "bake").blob)
    future = make_bundle(tmp_path / "future", model="future-model")
    stamped = future.manifest.model_copy(update={"created": f"{TRUE_NOW + DAY:%Y-%m-%dT%H:%M:%SZ}"})
    quarantine.publish(stamped, future.blob)  # a pod whose clock is a day ahead stamped it
    got = {
        r.key_digest: r for r in prune(quarantine, dt.timedelta(days=2.5), now=TRUE_NOW + SKEWS[clock], dry_run=True)
    }
    old, ahead = got[world[3].key_digest], got[stamped.key_digest]
    assert old.expired == (clock == "a-day-ahead")
    if old.expired:
        assert "3.0 days old (2026-12-02 12:00 UTC by this host's clock), more than 60h" in old.why
    assert ahead.expired == (TRUE_NOW + SKEWS[clock] + CLOCK_SKEW < TRUE_NOW + DAY)  # all but the node a day ahead
    if ahead.expired:
        assert "in the future" in ahead.why and "by this host's clock" in ahead.why and "NTP" in ahead.why
