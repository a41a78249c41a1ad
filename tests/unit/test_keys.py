"""Keys: stable digests, sensitive to every factor, free of per-host noise."""

import json
import subprocess
import sys

import pytest

from prebake.artifacts.errors import PrebakeError
from prebake.artifacts.keys import Key, canonical_json, policy_factors

GROUPS = {"software": {"torch": "2.13.0+cpu", "python": "3.11"}, "parallel": {"tp": 1}}


def test_same_factors_give_the_same_digest_regardless_of_order():
    a = Key.of("graphs", GROUPS)
    b = Key.of("graphs", {"parallel": {"tp": "1"}, "software": {"python": "3.11", "torch": "2.13.0+cpu"}})
    assert a == b and a.digest == b.digest


def test_digest_is_stable_across_processes():
    code = "from prebake.artifacts.keys import Key; import json,sys;print(Key.of('graphs', json.loads(sys.argv[1])).digest)"
    other = subprocess.run([sys.executable, "-c", code, json.dumps(GROUPS)], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == Key.of("graphs", GROUPS).digest


def test_digest_is_pinned_so_a_format_change_cannot_slip_through():
    # If this changes, every published bundle stops matching: bump the schema version instead.
    assert Key.of("graphs", GROUPS).digest == "d1a2bddfd99652d669ca8f38da3a9cad037ba8947ab20ac7453849775841b0de"


@pytest.mark.parametrize(
    "group,name,value",
    [("software", "torch", "2.14.1"), ("software", "python", "3.12"), ("parallel", "tp", 2)],
)
def test_changing_any_factor_changes_the_digest(group, name, value):
    changed = {g: dict(f) for g, f in GROUPS.items()}
    changed[group][name] = value
    assert Key.of("graphs", changed).digest != Key.of("graphs", GROUPS).digest


def test_kind_is_part_of_the_identity():
    assert Key.of("graphs", GROUPS).digest != Key.of("autotune", GROUPS).digest


def test_diff_names_each_differing_factor_with_both_values():
    here = Key.of("graphs", GROUPS)
    there = Key.of("graphs", {**GROUPS, "software": {"torch": "2.14.1", "python": "3.11"}})
    assert here.diff(there) == {"software.torch": ("2.13.0+cpu", "2.14.1")}


def test_paths_are_refused_as_factors():
    with pytest.raises(PrebakeError, match="looks like a path"):
        Key.of("graphs", {"cache": {"dir": "/root/.cache/vllm"}})


def test_json_round_trip_keeps_the_digest():
    key = Key.of("graphs", GROUPS)
    assert Key.from_json(json.loads(canonical_json(key.to_json()))).digest == key.digest


def test_salt_disowns_old_bundles(monkeypatch):
    plain = Key.of("graphs", {**GROUPS, "policy": policy_factors({})})
    salted = Key.of("graphs", {**GROUPS, "policy": policy_factors({"PREBAKE_KEY_SALT": "epoch-2"})})
    assert plain.digest != salted.digest
