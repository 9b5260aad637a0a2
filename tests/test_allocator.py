"""Freed memory kept for the next step (ecofl.allocator): a step's tensors are not faulted in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: A training step's blocks (three of 1 MiB) allocated, written and freed together, twelve times, through the C
#: library's malloc (as torch's CPU allocator does, without torch's own threads in the way); the minor page faults
#: of each step. By default glibc hands the 3 MiB freed at the top of its heap back (more than twice the largest
#: block it has unmapped) and faults them in again at the next step.
STEPS = """
import ctypes, json, resource, sys
from ecofl.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
sizes = [1 << 20] * 3

def step():
    blocks = [libc.malloc(size) for size in sizes]
    for block, size in zip(blocks, sizes):
        libc.memset(block, 1, size)
    for block in blocks:
        libc.free(block)

libc.free(libc.malloc(sizes[0]))  # freed alone first: glibc's threshold becomes its size, trimming twice that
faults = []
for _ in range(12):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def step_faults(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=300,
                          check=True)
    return json.loads(done.stdout)


def test_a_step_reuses_the_memory_the_last_step_freed():
    default, kept = step_faults("default"), step_faults("keep")
    if not kept["kept"]:
        pytest.skip("this C library has no mallopt (not glibc): nothing to set")
    if sum(default["faults"][6:]) < 1000:
        pytest.skip(f"this C library keeps freed memory by itself (steps faulted {default['faults']}): "
                    "nothing to compare")
    # once the first steps have grown the heap, a step faults in nothing new
    assert sum(kept["faults"][6:]) < 50, (kept, default)
    print(f"\npage faults a step, default malloc: {default['faults']}; freed memory kept: {kept['faults']}")
