"""The file pages a parked process had mapped, mapped again after a restore (snapshot/resident.py).

A restore maps each file again with none of its pages in the page tables; here MADV_DONTNEED on a
private file mapping does the same to a live one, so the record and the populate are tested on
this machine without CRIU."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest

from prebake.engine.bundled.snapshot import resident

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/pagemap").exists(), reason="Linux's pagemap"
)

PAGES = 2048  # 8 MiB: a page-cache folio (up to 2 MiB, mapped whole on a fault by newer kernels) is
# far from the whole file. CI's run of 12-06 at 1 MiB saw every page present after five reads.


@pytest.fixture
def mapped(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(bytes(range(256)) * (PAGES * resident.PAGE // 256))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as view:
        yield view


def _base(view: mmap.mmap) -> int:
    """The mapping's address, from /proc/self/maps (mmap objects do not say it)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[5].endswith("weights.bin"):
            return int(fields[0].split("-")[0], 16)
    raise AssertionError("the test's mapping is not in /proc/self/maps")


def _present_in(pages: resident.ResidentPages, start: int, length: int) -> set[int]:
    """The page numbers of [start, start + length) that `pages` holds."""
    return {
        (address + offset - start) // resident.PAGE
        for address, size in pages.runs
        for offset in range(0, size, resident.PAGE)
        if start <= address + offset < start + length
    }


def test_the_pages_read_before_are_recorded_and_mapped_again_after_the_page_tables_lost_them(mapped):
    start, length = _base(mapped), len(mapped)
    touched = (0, 1, 2, 100, 200)  # within the first 2 MiB
    for page in touched:  # read: present, with the kernel's fault-around (or the folio) beside them
        assert mapped[page * resident.PAGE] == 0
    recorded = resident.record()  # the parked process, before the dump
    read = _present_in(recorded, start, length)
    assert set(touched) <= read
    assert len(read) <= PAGES // 2  # what was read, not the whole file

    mapped.madvise(mmap.MADV_DONTNEED)  # what a restore leaves: the file mapped, none of its pages
    assert _present_in(resident.record(), start, length) == set()

    done = resident.populate(recorded)  # the restored process, before it says ready
    if done.failed and "MADV_POPULATE_READ" in done.failed:
        pytest.skip(done.failed)
    assert done.failed is None
    assert done.bytes == recorded.bytes
    assert _present_in(resident.record(), start, length) == read  # the same pages, no others


def test_the_line_says_what_was_made_present_and_why_not():
    assert resident.Populated(111_600_000, 0.009).line() == (
        "prebake serve: snapshot: 111.6 MB of mapped file pages made present again in 0.009 s"
    )
    assert "(some not: Bad address)" in resident.Populated(0, 0.0, "some not: Bad address").line()
