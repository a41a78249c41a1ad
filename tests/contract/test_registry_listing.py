"""`prebake ls` on every backend (file, s3, s3 without conditional writes, hf, a chain): the rows
`prebake.registry.shared.transfer.listed` gives are `Listed.of` of what `list()` yields, in the same order, whether a
backend answers from its listing summary or not; a registry that is down is reported, not empty."""

from __future__ import annotations

import pytest

from prebake.artifacts.ports.errors import RegistryUnavailable
from prebake.artifacts.ports.listing import Listed
from prebake.registry.shared.transfer import listed


def test_listing_shows_every_bundle_as_list_does_in_its_order(backend, bundle):
    for b in (bundle(kind="graphs"), bundle(kind="graphs", model="other"), bundle(kind="autotune")):
        backend.registry.publish(b.manifest, b.blob)

    for kind in (None, "graphs", "autotune"):
        rows = list(listed(backend.registry, kind))
        assert rows == [Listed.of(m) for m in backend.registry.list(kind)]
        assert rows and (kind is None or {r.kind for r in rows} == {kind})
    assert list(listed(backend.registry, "buckets")) == []
    assert list(listed(backend.second_client())) == list(listed(backend.registry))


def test_listing_an_unreachable_registry_is_reported_not_empty(down_registry):
    with pytest.raises(RegistryUnavailable, match="127.0.0.1"):
        list(listed(down_registry))
