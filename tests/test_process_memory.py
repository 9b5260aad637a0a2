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


def test_a_round_meter_counts_what_was_done_since_it_started_not_since_it_was_read():
    """A worker starts the next round's meter before it commits its copy (after its reply): the copy's CPU and
    the memory it maps are in that round's figures, and a meter started after them has neither."""
    import time

    from ecofl.pipeline.runtime.round_meter import RoundMeter

    meter = RoundMeter("cpu")
    if meter.resident is None:
        pytest.skip("this kernel does not allow resetting the peak resident set (/proc/self/clear_refs)")
    block = mmap.mmap(-1, 32 << 20)  # the commit's copy, taken after the reply
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    spin = time.thread_time() + 0.05
    while time.thread_time() < spin:
        pass
    block.close()
    figures = meter.figures({})  # read before the next meter starts: starting one resets the process's peak
    after = RoundMeter("cpu").figures({})  # a meter started once the copy was taken
    assert figures["first_touched_bytes"] >= 30 << 20 and after["first_touched_bytes"] < 8 << 20
    assert figures["cpu_s"] >= 0.05 > after["cpu_s"]
    assert figures["cpu_s_by_job"]["MainThread"] >= 0.05 and figures["peak_accelerator_bytes"] is None
