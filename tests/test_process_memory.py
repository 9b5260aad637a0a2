"""Measured process memory: the resident set and its peak, which a sync-round resets and reads."""

import mmap
from pathlib import Path

import pytest

from ecofl.pipeline.runtime.process_memory import mapped_since, peak_rss_bytes, reset_peak, resident_from_now, rss_bytes

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


def test_memory_mapped_anew_is_the_growth_of_the_peak_from_where_it_was_reset():
    resident = resident_from_now()
    if resident is None:
        pytest.skip("this kernel does not allow resetting the peak resident set (/proc/self/clear_refs)")
    block = mmap.mmap(-1, 32 << 20)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    mapped = mapped_since(resident)
    block.close()  # unmapped: the peak keeps it (the kernel's counters are per thread, synced now and then)
    assert mapped >= 30 << 20 and mapped_since(resident) >= mapped - (1 << 20)
    assert mapped_since(resident_from_now()) < 8 << 20  # a new peak starts from the resident set without it
