"""A feature started without its extra says, in one line, which extra to install."""

from __future__ import annotations

import pytest

from prebake.artifacts.errors import MissingExtraError
from prebake.artifacts.extras import EXTRAS, missing, require
from prebake.registry import open_registry


def test_every_extra_is_installed_where_the_suite_runs():
    assert {extra: missing(extra) for extra in EXTRAS} == dict.fromkeys(EXTRAS)


def test_a_missing_module_under_an_absent_parent_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(EXTRAS, "blob", ("json", "no_such_vendor.storage.blob"))
    with pytest.raises(MissingExtraError) as raised:
        require("blob", "an az:// registry")
    assert str(raised.value) == "an az:// registry needs no_such_vendor.storage.blob: pip install 'prebake[blob]'"


def test_opening_an_address_checks_its_backends_extra_first(monkeypatch):
    monkeypatch.setitem(EXTRAS, "s3", ("no_such_boto",))
    with pytest.raises(MissingExtraError, match=r"^an s3:// registry needs no_such_boto: pip install 'prebake\[s3\]'$"):
        open_registry("s3://bucket/prefix")
