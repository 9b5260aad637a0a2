"""A home's GPU devices measure themselves on their GPUs, as confined devices do in their cgroups.

A device whose pool entry names a GPU (``accelerator: cuda``) trains its
stage there (docs/pipeline_accelerators.md). Its speed for the planner is not
the pool's number: a GPU's speed-up over a host core differs by layer and by
micro-batch (a small layer or a small call leaves most of a GPU idle, and
pays a kernel launch a layer all the same). So at host speed
(``--emulate none``) such devices calibrate before the plan is made, as
confined devices do (:mod:`.calibration`, Asteroid §3.3; FTPipeHD §III-D):
each times its work on its own GPU, the whole model first, then the layers and
share of the stage the plan on those speeds gives it, and the pool a plan is
predicted on is the one they measured on their own stages. Their speeds stay
in the host pool the cost model predicts a host-speed run on
(:func:`ecofl.devices.host_pool`), where a CPU device is one host core.

:class:`AcceleratorDevices` is what :func:`~.calibration.measure_speeds`
needs of a :class:`~.confinement.Confinement` for them: no cgroup (a GPU
device's worker is a process of this machine with one torch thread) and
nothing to throttle. Devices on the same GPU with the same budget share one
measurement, as confined devices alike do; they measure at the same time, as
they will train, so a shared GPU's contention is in what they measure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ecofl.cgroups import DeviceLimits
from ecofl.devices import HomePool
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime.calibration import (
    CALIBRATION_S, ConfinedPool, Workload, measure_speeds, whole_model,
)
from ecofl.pipeline.runtime.confinement import THREADS_ENV
from ecofl.pipeline.runtime.model_spec import ModelSpec


@dataclass(frozen=True)
class AcceleratorLimits(DeviceLimits):
    """A device training on a GPU of this machine: one host core for the runtime's own work (messages,
    hand-offs, host copies), its memory budget, and which GPU (devices share a measurement only on the same one)."""

    accelerator: str = "cuda"


class _Unconfined:
    """A GPU device's calibrating process runs as it is started: no cgroup to enter first."""

    @staticmethod
    def entry_command() -> list[str]:
        return []


class AcceleratorDevices:
    """The devices of ``pool`` that train on a GPU (or those ``devices`` names, wherever they train), as
    :func:`~.calibration.measure_speeds` times them: processes of this machine, each on its accelerator."""

    def __init__(self, pool: HomePool, devices: Iterable[int] | None = None):
        if devices is None:
            devices = [d for d, spec in enumerate(pool.devices) if spec.accelerator != "cpu"]
        self.limits = {d: AcceleratorLimits(1.0, pool.devices[d].memory_bytes, pool.devices[d].accelerator)
                       for d in devices}

    def enter(self, device: int) -> tuple[_Unconfined, dict[str, str]]:
        """Nothing to enter; the process's environment: one torch thread, as a worker's."""
        return _Unconfined(), {"OMP_NUM_THREADS": "1", THREADS_ENV: "1"}

    def throttle(self, device: int) -> None:
        """A GPU device has no quota to be put under once ready."""

    def out_of_memory(self, device: int) -> bool:
        """No cgroup's memory limit kills a GPU device's process (torch raises instead)."""
        return False

    def release(self, device: int) -> None:
        """No cgroup to remove."""


def has_accelerators(pool: HomePool) -> bool:
    """Whether any device of ``pool`` trains on a GPU."""
    return any(spec.accelerator != "cpu" for spec in pool.devices)


def calibrate_accelerators(model: ModelSpec, input_shape: tuple[int, ...], profile: ModelProfile,
                           presets: HomePool, workload: Workload | int, min_seconds: float = CALIBRATION_S,
                           objective: str = "training") -> ConfinedPool:
    """``presets`` with each GPU device's speed measured on its GPU on ``objective``'s steps of its work
    (``workload``; a number: the whole model at that many samples), the CPU devices as they were. The speed
    is the host profile's seconds for the step's layers over the measured step: the runtime's own work around
    each operation (bookkeeping, messages) runs on the device's host core, not its GPU, and the cost model adds
    it there, on top of the step (:attr:`~ecofl.devices.DeviceSpec.operation_speed`). The ``limits`` of the
    result are the GPU devices' :class:`AcceleratorLimits` (no cgroup: a run passes none)."""
    devices = AcceleratorDevices(presets)
    if isinstance(workload, int):
        workload = whole_model(range(len(presets.devices)), workload)
    pool, measured = measure_speeds(model, input_shape, profile, presets, devices, workload, min_seconds,
                                    objective=objective)
    return ConfinedPool(pool, devices.limits, measured, workload)
