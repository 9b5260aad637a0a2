"""The cgroups of a home's local devices: one per worker, created as it starts and removed when it ends.

``--emulate cgroup`` (:class:`~ecofl.pipeline.runtime.emulation.Emulation`):
each device's worker runs under its :class:`~ecofl.cgroups.DeviceLimits`
(its speed as a CPU quota in host cores, its memory budget as a memory
limit; :mod:`ecofl.cgroups`), with as many torch threads as it has whole
cores (at least one). A load spike (``--inject slow:D*F@R``, Eco-FL §4.4)
divides the device's quota by F: the worker is not told, and the portal
can only see it in the measured times.

A worker starts with :data:`STARTUP_CORES` (importing torch at a tenth of a
core would take ten times as long as here, and no figure measures it) and
gets its device's quota once it is ready, before its first sync-round. Its
memory limit is the device's budget for training (weights, optimizer state,
activations: what the planners' memory model counts, and what a preset's
memory is: the board's RAM less the OS and runtime) on top of what the
kernel charges the worker's cgroup once it is ready (Python, torch, this
package and the model it built; not the shared libraries another process
loaded first, which a resident set would count); until then the budget plus
:data:`STARTUP_ALLOWANCE_BYTES`. A worker killed by the kernel at its
memory limit is told apart from a kill or a crash (:meth:`Confinement.out_of_memory`).

While any device is confined, an idle-priority spinner keeps each of this
machine's cores awake (:class:`~ecofl.awake_cores.AwakeCores`): a halted
core would otherwise slow every slice of a device's quota by a quarter, and
unevenly.

A pool is refused when its quotas do not fit this machine's cores with
:data:`PORTAL_RESERVE_CORES` left for the portal (Eco-FL §3: the portal
drives the pipeline, sends the inputs and gathers the outputs).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from ecofl.awake_cores import AwakeCores
from ecofl.cgroups import DeviceCgroup, DeviceLimits, Hierarchy, find_hierarchy, remove_stale
from ecofl.devices import HomePool, host_cores
from ecofl.errors import UserError
from ecofl.interrupt import interrupts_deferred

PORTAL_RESERVE_CORES = 0.5
STARTUP_CORES = 1.0
STARTUP_ALLOWANCE_BYTES = 1 << 30
THREADS_ENV = "ECOFL_DEVICE_THREADS"  # torch threads of a worker (default 1)


class Confinement:
    """Cgroups for the devices in ``limits`` (device index -> its limits) on ``hierarchy`` (default: found here)."""

    def __init__(self, limits: Mapping[int, DeviceLimits], hierarchy: Hierarchy | None = None,
                 cores: float | None = None):
        if hierarchy is None:
            found = find_hierarchy()
            if isinstance(found, str):
                raise UserError(f"cannot confine devices with cgroups: {found} (use --emulate sleep)")
            hierarchy = found
        check_fits(limits, host_cores() if cores is None else cores)
        self.limits, self.hierarchy = dict(limits), hierarchy
        self.groups: dict[int, DeviceCgroup] = {}
        self.throttled: set[int] = set()  # devices under their own quota (ready workers)
        self.slowdowns: dict[int, float] = {}
        self.awake = AwakeCores()  # running while any device has a cgroup
        remove_stale(hierarchy)

    @classmethod
    def of_pool(cls, pool: HomePool, devices: list[int] | None = None) -> "Confinement":
        """Each device of ``pool`` (or of ``devices``) confined to its speed in cores and its memory budget."""
        limits = pool_limits(pool)
        return cls(limits if devices is None else {d: limits[d] for d in devices})

    @property
    def name(self) -> str:
        return self.hierarchy.name

    def enter(self, device: int) -> tuple[DeviceCgroup, dict[str, str]]:
        """A fresh cgroup for ``device``'s worker, and the worker's environment (its torch threads)."""
        self.release(device)
        limits = self.limits[device]
        startup = DeviceLimits(STARTUP_CORES, limits.memory_bytes + STARTUP_ALLOWANCE_BYTES)
        with interrupts_deferred():  # no cgroup made and not recorded for release(): Ctrl-C waits for both
            self.groups[device] = self.hierarchy.create(f"device{device}", startup)
        self.awake.start()
        threads = str(max(1, math.floor(limits.cores)))
        return self.groups[device], {"OMP_NUM_THREADS": threads, THREADS_ENV: threads}

    def throttle(self, device: int) -> None:
        """``device``'s worker is ready: from now on its quota, and its budget on top of what it holds now."""
        group = self.groups[device]
        group.set_memory(self.limits[device].memory_bytes + group.memory_usage_bytes())
        self.throttled.add(device)
        self._set_quota(device)

    def slow(self, device: int, factor: float) -> None:
        """Divide ``device``'s CPU quota by ``factor`` (a load spike), for good."""
        self.slowdowns[device] = factor
        if device in self.throttled:
            self._set_quota(device)

    def _set_quota(self, device: int) -> None:
        self.groups[device].set_cores(self.limits[device].cores / self.slowdowns.get(device, 1.0))

    def out_of_memory(self, device: int) -> bool:
        """Whether the kernel killed a process of ``device`` at its memory limit."""
        group = self.groups.get(device)
        return group is not None and group.oom_kills() > 0

    def report(self, device: int) -> dict[str, float | int | str | None]:
        """What ``device`` ran under: its quota (cores), memory limit and the cgroup's peak memory, and how often
        CFS held it throttled since its worker started (:meth:`~ecofl.cgroups.DeviceCgroup.throttling`)."""
        group = self.groups.get(device)
        if group is None:
            return {}
        return {"cgroup": self.name, "cpu_quota": round(group.cores, 4),
                "memory_budget_bytes": self.limits[device].memory_bytes,
                "memory_limit_bytes": group.memory_limit_bytes, "cgroup_peak_bytes": group.peak_memory_bytes(),
                **group.throttling()}

    def release(self, device: int) -> None:
        """Remove ``device``'s cgroup (killing what still runs in it)."""
        group = self.groups.get(device)
        if group is not None:
            group.remove()  # recorded until removed: close() retries it if this is interrupted
        self.groups.pop(device, None)
        self.throttled.discard(device)
        if not self.groups:
            self.awake.stop()

    def close(self) -> None:
        errors = []
        for device in list(self.groups):
            try:
                self.release(device)
            except (OSError, RuntimeError) as error:
                errors.append(f"device {device}: {error}")
        self.awake.stop()
        if errors:
            raise RuntimeError("cgroups left behind: " + "; ".join(errors))


def worker_threads() -> int:
    """The torch threads a worker uses: as many as its cgroup's whole cores, else one."""
    return max(1, int(os.environ.get(THREADS_ENV, "1")))


def pool_limits(pool: HomePool) -> dict[int, DeviceLimits]:
    """Each device of ``pool`` as a confined device: its speed in host cores, its memory budget."""
    return {d: DeviceLimits(spec.speed, spec.memory_bytes) for d, spec in enumerate(pool.devices)}


def check_fits(limits: Mapping[int, DeviceLimits], cores: float) -> None:
    """Refuse devices whose quotas add up to more than ``cores`` less the portal's reserve."""
    total = sum(limit.cores for limit in limits.values())
    room = cores - PORTAL_RESERVE_CORES
    if total > room + 1e-9:
        listed = ", ".join(f"{d}: {limit.cores:.3g}" for d, limit in sorted(limits.items()))
        raise UserError(f"the devices' CPU quotas add up to {total:.3g} cores ({listed}), more than this machine's "
                        f"{cores:g} cores less {PORTAL_RESERVE_CORES} for the portal: confined devices would not "
                        f"get their quota")
