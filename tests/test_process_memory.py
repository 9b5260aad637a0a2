"""Measured process memory: the resident set and its peak, which a sync-round resets and reads."""

import mmap
from pathlib import Path

import pytest

from ecofl.pipeline.runtime.process_memory import first_touched_bytes, peak_rss_bytes, reset_peak, rss_bytes

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")


def test_peak_follows_an_allocation_and_resets_to_the_current_resident_set():
    if not reset_peak():
        pytest.skip("this kernel does not allow resetting the peak resident set (/proc/self/clear_refs)")
    before = rss_bytes()
    block = mmap.mmap(-1, 64 << 20)  # 64 MiB of fresh pages (an allocator could hand back pages it kept)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1  # touched: resident
    peak = peak_rss_bytes()
    assert peak >= before + (60 << 20)
    block.close()
    assert reset_peak()
    assert peak_rss_bytes() < peak - (32 << 20)  # back near the resident set without the block


def test_first_touched_memory_counts_fresh_pages_once():
    block = mmap.mmap(-1, 32 << 20)
    before = first_touched_bytes()
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    touched = first_touched_bytes() - before
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 2  # mapped already: no fault
    again = first_touched_bytes() - before - touched
    block.close()
    assert touched >= 30 << 20 and again < 1 << 20
