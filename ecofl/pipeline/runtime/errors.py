"""What can go wrong while a home pipeline runs, as errors the portal raises.

Every failure of a worker ends at the portal as one of these, within the
portal's ``timeout_s``, after the portal has stopped every worker it started.
"""

from __future__ import annotations


class HomePipelineError(RuntimeError):
    """The home pipeline could not run; the message says which device and why."""


class DeviceUnreachable(HomePipelineError):
    """A device of the plan did not join the home in time."""


class WorkerDied(HomePipelineError):
    """A worker's process or connection ended while the pipeline needed it."""


class DeviceOutOfMemory(WorkerDied):
    """The kernel killed a confined device's worker at its cgroup's memory limit (``--emulate cgroup``)."""


class WorkerFailed(HomePipelineError):
    """A worker raised an error; its message is carried to the portal."""


class EmulatedOOM(HomePipelineError):
    """An emulated device would exceed its memory budget (weights, optimizer state, activations)."""


class WorkerTimeout(HomePipelineError):
    """A worker did not answer within the portal's timeout."""


class DevicesLost(HomePipelineError):
    """Devices failed during a sync-round that the portal can recover from (fault tolerance on)."""

    def __init__(self, failures: dict[int, str]):
        self.failures = dict(failures)  # device -> why it is declared failed
        super().__init__("device(s) lost: " + ", ".join(f"{d} ({why})" for d, why in sorted(failures.items())))
