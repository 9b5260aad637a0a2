"""Emulating a home's devices on one machine (docs/pipeline.md).

Three modes (:class:`Emulation`), named in every result, and a fourth for
a deployed home, whose devices are not emulated at all:

- ``cgroup``: each device's worker is confined by the kernel to the
  device's CPU and memory (:mod:`ecofl.cgroups`,
  :mod:`ecofl.pipeline.runtime.confinement`); nothing sleeps to a model (an
  operation lasts at least its CPU time over the device's cores,
  :mod:`.cpu_pace`), every time is real and the devices truly differ;
- ``sleep``: every device sleeps to the cost model's time (below), so
  measured equals predicted by construction and only overheads are
  measured: the model's figures;
- ``none``: every device at host speed (real, but all alike): the devices
  are processes of this machine, sharing its cores;
- ``real``: the devices are the home's own machines (the home service's
  daemons, docs/deploy.md): nothing emulated, and a plan is predicted at
  the speeds they measured, each on its own cores, not at this machine's.

Links are paced by a token bucket in ``cgroup`` and ``sleep`` mode (or shaped
by the kernel in network namespaces). What ``sleep`` mode does:

- **Time dilation**: an operation takes the longer of its real time and its
  emulated time: the cost model's time for it when a profile is given (host
  profile / device speed, :func:`ecofl.pipeline.cost.stage_compute_s`), else
  real time / speed. The worker sleeps the difference.
- **Link bandwidth**: a token bucket per link (:class:`ecofl.net.pacing.TokenBucket`)
  paces the bytes a worker sends.
- **Memory accounting**: weights, accumulated gradients, optimizer state and
  the activations each resident forward task keeps for its backward
  (Asteroid eq. 3, Mem_p = MOD + OPT + K_p x ACT_p), measured from the saved
  tensors of every forward; exceeding the device's budget is
  :class:`~ecofl.pipeline.runtime.errors.EmulatedOOM`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum

import torch

from ecofl.cgroups import find_hierarchy
from ecofl.errors import UserError
from ecofl.pipeline.runtime.errors import EmulatedOOM


class Emulation(StrEnum):
    """How a home's devices are emulated on this machine."""

    CGROUP = "cgroup"  # confined by cgroups: real CPU quota and memory limit
    SLEEP = "sleep"  # sleeping to the cost model's time: the model's figures
    NONE = "none"  # host speed
    REAL = "real"  # a deployed home's own machines

    @property
    def on_this_host(self) -> bool:
        """The devices are processes of this machine at its speed, sharing its cores (``none``)."""
        return self is Emulation.NONE

    @property
    def paces_links(self) -> bool:
        """The pipeline paces each link to its device's bandwidth (``cgroup``, ``sleep``)."""
        return self in (Emulation.CGROUP, Emulation.SLEEP)

    @property
    def at_own_speeds(self) -> bool:
        """The devices compute for real at speeds of their own (``cgroup``, ``real``): which of them a plan
        uses, and whether a stage gets several, are the home's to weigh (PipeEdge's selection, Asteroid's
        hybrid stages)."""
        return self in (Emulation.CGROUP, Emulation.REAL)

    @classmethod
    def parse(cls, value: "str | Emulation") -> "Emulation":
        """A mode from its name (a UserError naming the valid ones otherwise)."""
        try:
            return cls(value)
        except ValueError:
            raise UserError(f"unknown emulation {value!r}; valid: {', '.join(cls)}") from None


def default_emulation() -> tuple[Emulation, str]:
    """``cgroup`` where this machine's cgroups are writable, else ``sleep``; with the one line that says why."""
    found = find_hierarchy()
    if isinstance(found, str):
        return Emulation.SLEEP, f"emulation: sleep (devices sleep to the cost model's time; no cgroups: {found})"
    return Emulation.CGROUP, f"emulation: cgroup ({found.name}; each device confined to its cores and memory)"


def dilate(started: float, emulated_s: float | None, speed: float, abort: Callable[[], None] | None = None) -> float:
    """Sleep until an operation begun at ``started`` (time.time()) has lasted its emulated time; return the end.

    The emulated time is ``emulated_s`` if given, else the real time / ``speed``.
    ``abort`` is checked while sleeping (an interrupted sync-round stops at once).
    """
    real = time.time() - started
    goal = emulated_s if emulated_s is not None else real / speed
    end = started + goal
    while (left := end - time.time()) > 0:
        if abort is not None:
            abort()
        time.sleep(min(left, 0.02) if abort is not None else left)
    return time.time()


@contextmanager
def saved_bytes(exclude: list[torch.Tensor]) -> Iterator[list[int]]:
    """Measure the bytes autograd keeps for backward inside the block (parameters excluded).

    Yields a one-element list that holds, after the block, the total size of the
    distinct storages packed by :func:`torch.autograd.graph.saved_tensors_hooks`.
    """
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    total = [0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield total
    total[0] = sum(storages.values())


class MemoryLedger:
    """One device's memory: MOD + OPT fixed, plus the activations of resident forward tasks.

    After each forward the ledger checks the peak the schedule will reach,
    ``fixed + max(resident now, resident_bound x largest forward seen)``:
    every micro-batch of a stage is the same size, so the device's peak is
    known from the first forward and an out-of-memory is raised before the
    host allocates it (with ``enforce``; otherwise the ledger only measures).
    """

    def __init__(self, device: str, stage: int, budget: int, fixed: int, resident_bound: int, schedule: str,
                 enforce: bool):
        self.device, self.stage, self.budget, self.fixed = device, stage, budget, fixed
        self.resident_bound, self.schedule, self.enforce = resident_bound, schedule, enforce
        self.resident: dict[int, int] = {}
        self.largest = 0
        self.peak_count = 0
        self.peak_bytes = 0

    def forward(self, micro_batch: int, nbytes: int) -> None:
        self.resident[micro_batch] = nbytes
        self.largest = max(self.largest, nbytes)
        self.peak_count = max(self.peak_count, len(self.resident))
        self.peak_bytes = max(self.peak_bytes, sum(self.resident.values()))
        projected = max(sum(self.resident.values()), self.resident_bound * self.largest)
        if self.enforce and self.fixed + projected > self.budget:
            raise EmulatedOOM(
                f"emulated out of memory on device {self.device} (stage {self.stage}, {self.schedule}): "
                f"{self.resident_bound} resident micro-batches x {_size(self.largest)} activations = "
                f"{_size(projected)} + {_size(self.fixed)} weights, gradients and optimizer state = "
                f"{_size(self.fixed + projected)} > budget {_size(self.budget)}"
            )

    def backward(self, micro_batch: int) -> None:
        del self.resident[micro_batch]


def _size(nbytes: float) -> str:
    units, i = ("B", "KiB", "MiB", "GiB"), 0
    while nbytes >= 1024 and i < len(units) - 1:
        nbytes, i = nbytes / 1024, i + 1
    return f"{nbytes:.1f} {units[i]}"
