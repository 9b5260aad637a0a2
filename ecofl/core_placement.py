"""Each confined device held on host cores of its own, as a real board's cores belong to that board alone.

A confined device (:mod:`ecofl.cgroups`) runs a slice of its quota, is
throttled, and runs again; left to the scheduler, its next slice may start
on another of this machine's cores, whose caches hold another device's
layers. A real board's next slice starts on its own warm core. So each
device's worker is held (``sched_setaffinity``, every thread; threads it
starts later inherit it) on the host cores :func:`place_on_cores` gives it:
whole devices packed onto the least-loaded cores, a device of ``c`` cores on
``ceil(c)`` of them.

Measured on this 2-core machine (2026-12-04 13:51-13:56, load 2.5 before; the
mixed Raspberry Pi home, MobileNetV2, one kept calibration, 6 sync-rounds
after the first, runs alternated): the median sync-round was 5.60 and 6.17 s
with the devices free to move, 5.00 and 4.60 s with each held on one core
(the TX2 alone on one, the other three on the other), predicted 4.22 s.

``ECOFL_PIN_DEVICES=0`` leaves the devices free to move (to measure the two
side by side, ``benchmarks/core_placement.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence

PIN_ENV = "ECOFL_PIN_DEVICES"


def pinning_enabled() -> bool:
    """Whether confined devices are held on their cores (``ECOFL_PIN_DEVICES``, default on)."""
    return os.environ.get(PIN_ENV, "1") != "0"


def place_on_cores(cores: Mapping[int, float], cpus: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Host cores for each device (device -> its quota in cores): the largest first, each onto the ``ceil(quota)``
    least-loaded of ``cpus`` (ties: the lowest core), which then carry its quota shared evenly."""
    if not cpus:
        raise ValueError("no host cores to place devices on")
    load = {cpu: 0.0 for cpu in sorted(cpus)}
    placed: dict[int, tuple[int, ...]] = {}
    for device in sorted(cores, key=lambda d: (-cores[d], d)):
        if not cores[device] > 0:
            raise ValueError(f"device {device}: a quota must be positive, got {cores[device]}")
        count = min(len(load), math.ceil(cores[device] - 1e-9))
        chosen = sorted(sorted(load, key=lambda cpu: (load[cpu], cpu))[:count])
        for cpu in chosen:
            load[cpu] += cores[device] / count
        placed[device] = tuple(chosen)
    return placed


def hold_on_cores(pids: Iterable[int], cpus: Iterable[int]) -> None:
    """Hold every thread of each process in ``pids`` on ``cpus`` (a thread or process that has ended is skipped)."""
    allowed = set(cpus)
    for pid in pids:
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue
        for thread in threads:
            try:
                os.sched_setaffinity(int(thread), allowed)
            except (ProcessLookupError, FileNotFoundError):
                continue
