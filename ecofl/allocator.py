"""Freed memory kept for the next allocation instead of handed back to the kernel.

A training step allocates and frees the same tensors every micro-batch
(activations, gradients, the pieces of a message), and a fault-tolerant
round clones its stage's state and receives a replica. glibc's malloc
serves a large block with its own ``mmap`` and unmaps it when it is freed
(above a threshold that adapts, from 128 KiB), and hands the top of its heap
back to the kernel once enough of it is free (trim). Each time the memory is
allocated again, the kernel faults its pages back in, zero-filled, and a
confined device pays for that out of the same CPU quota it computes with.
On Eco-FL's confined testbed (MobileNetV2, ``ecofl-3stage``, ``--emulate
cgroup``) a worker took 400-2,400 page faults a second, and about a tenth
of its CPU time was the kernel's.

:func:`keep_freed_memory` sets ``M_MMAP_THRESHOLD`` to 32 MiB (the most
glibc allows on 64-bit hosts) and ``M_TRIM_THRESHOLD`` to its largest value:
blocks up to 32 MiB come from malloc's heaps, and what a step frees stays
there for the next. A process's peak memory does not change (it held that
memory at its peak anyway); only its return between steps stops. Workers
and every measurement of a device's speed (calibration, the host's profile)
set it alike, so a prediction and the run it predicts allocate the same
way. So does every process that trains a home's model whole: a simulated
ClientApp, the in-process transport and ``ecofl train``. Without it a
MobileNetV2 step (batch 32 at 3 x 32 x 32, one thread) took 4,900-8,300
page faults and 0.117-0.124 s in fresh processes, with it 0-450 and
0.107-0.110 s (2026-12-05 18:45, ten processes each; the quickstart's
FedAvg CNN at batch 10 faulted little either way, 11.3-13.3 against
11.5-13.7 ms). The same fault-in made a fixed convolution take 2.8 ms in
most fresh processes and 1.5 ms in some (``benchmarks/host_probe.py``).
Elsewhere than glibc (musl, macOS) it does nothing.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts
TRIM_NEVER = 2**31 - 1  # mallopt takes an int


def keep_freed_memory() -> bool:
    """Keep freed blocks of up to 32 MiB in this process for reuse; False where the C library has no ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_NEVER) == 1
