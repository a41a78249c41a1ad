"""`prebake ls` of an OCI registry with a listing summary, against docker-registry behind the counting
proxy: the first listing reads every entry and stores the summary; a later one (another client) costs
the tags list and the summary, no entry read; entries added, quarantined or republished behind its
back cost reads, never a wrong or a missing row."""

from __future__ import annotations

import uuid

import pytest

from prebake.artifacts.ports.listing import Listed
from prebake.registry.shared.transfer import listed
from tests.faults.fault_proxy import fault_proxy
from tests.support.index_seed import seed_oci, synthetic_manifests
from tests.support.oci_server import oci_available, oci_server

ENTRIES = 80  # above SUMMARY_MIN_ROWS: the kind keeps a summary


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    if not oci_available():
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; .ci/run does)")
    with oci_server(tmp_path_factory.mktemp("oci-listing")) as server, fault_proxy(server.url) as proxy:
        yield server, proxy


def _registry(plain):
    from prebake.registry.oci import OCIRegistry
    from prebake.registry.oci.address import OCISettings

    server, proxy = plain
    host = proxy.url.removeprefix("http://")
    repo = f"ls/r{uuid.uuid4().hex[:10]}"
    make = lambda: OCIRegistry(f"oci://{host}/{repo}", OCISettings(plain_http=(host,), settle_s=0))  # noqa: E731
    return make, proxy


def _entry_reads(proxy, before: int) -> int:
    return sum(1 for m, p, *_ in proxy._log[before:] if m == "GET" and "/manifests/graphs-" in p)


def test_listing_an_oci_registry_again_reads_no_entry(plain):
    make, proxy = _registry(plain)
    first = make()
    published = seed_oci(first, synthetic_manifests(ENTRIES, files=5))
    expected = [Listed.of(m) for m in sorted(published, key=lambda m: m.key_digest)]
    assert list(first.listing("graphs")) == expected  # reads every entry, stores the summary

    before = len(proxy._log)
    assert list(listed(make(), "graphs")) == expected
    sent = proxy._log[before:]
    assert _entry_reads(proxy, before) == 0
    assert len(sent) <= 5, sent  # /v2/ probe, tags list, the summary's manifest and blob


def test_entries_added_or_quarantined_behind_the_summary_cost_reads_never_a_wrong_row(plain, tmp_path):
    make, proxy = _registry(plain)
    registry = make()
    manifests = synthetic_manifests(ENTRIES + 5, files=5)
    published = seed_oci(registry, manifests[:ENTRIES])
    list(registry.listing("graphs"))
    published += seed_oci(registry, manifests[ENTRIES:])
    gone = published[0]
    registry.quarantine("graphs", gone.key_digest)

    before = len(proxy._log)
    rows = list(make().listing("graphs"))

    assert rows == [Listed.of(m) for m in sorted(published[1:], key=lambda m: m.key_digest)]
    assert _entry_reads(proxy, before) == 5  # the five new entries only
    assert rows == [Listed.of(m) for m in make().list("graphs")]
