"""Devices of a home and the pool they form.

A :class:`DeviceSpec` is what the planner knows of one device: how fast it
computes, how much memory training may use on it, and its link bandwidth.
A :class:`HomePool` is the home's devices plus the bandwidth between every
pair (device 0 is the portal node, Eco-FL §3).

Speeds are relative to *the host core the profiles were measured on*
(``speed = 1`` runs a layer as fast as one core of this machine; a device's
time for a layer is ``host_time / speed``). The presets derive their speeds
from the papers (see :data:`PRESETS`) and put them on the host's scale with
one constant, :data:`NANO_10W_SPEED`, so every preset is at least 5x slower
than a host core: that keeps emulated homes of several devices within what
two cores can run for real (docs/architecture.md; docs/pipeline.md, emulation).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import numpy as np

from ecofl.errors import UserError

MBPS = 1e6 / 8  # bytes per second in one megabit per second
GB = 1 << 30

#: Speed of a Jetson Nano in 10 W mode relative to one host core (the one knob
#: that maps the papers' relative speeds onto this machine).
NANO_10W_SPEED = 0.1


#: What a device's ``accelerator`` may be: the CPU, or a GPU of the device's own machine.
ACCELERATOR = re.compile(r"cpu|cuda(:\d+)?")

@dataclass(frozen=True)
class DeviceSpec:
    """One device: relative compute speed, memory budget for training, link bandwidth."""

    name: str
    speed: float  # relative to one host core (host_time / speed = device time)
    memory_bytes: int  # budget for weights + optimizer state + activations
    bandwidth_bps: float  # bytes/s of the device's link to the home network
    accelerator: str = "cpu"  # where its stage trains: "cpu", or a GPU ("cuda", "cuda:N") of its own machine
    # seconds its process takes to map a byte of memory for the first time, at its speed (measured in its
    # calibration or by its daemon, ecofl.pipeline.first_touch; None: not measured)
    first_touch_s_per_byte: float | None = None
    # host cores of CPU it runs on, where known: a confined device's quota (None: its speed stands for them)
    cores: float | None = None

    @property
    def cpu_speed(self) -> float:
        """The pace of the runtime's own work here (messages, hand-offs), relative to one host core: its cores
        where known, else its speed. A confined device computing one sample a call trains below its quota
        (its speed), while a message costs it its quota's pace."""
        return self.speed if self.cores is None else self.cores

    @property
    def operation_speed(self) -> float:
        """The pace of the runtime's work around each operation (its bookkeeping, and sealing and copying what
        crosses a link), relative to one host core: a CPU device's speed (that work shares its cores with its
        layers, and a confined device's calibrated speed already carries it), a GPU device's :attr:`cpu_speed`
        (its layers run on the GPU, that work on its host core)."""
        return self.speed if self.accelerator == "cpu" else self.cpu_speed

    def __post_init__(self) -> None:
        if not isinstance(self.accelerator, str) or not ACCELERATOR.fullmatch(self.accelerator):
            raise UserError(f"device {self.name!r}: accelerator must be cpu, cuda or cuda:N, got {self.accelerator!r}")
        if not self.speed > 0:
            raise UserError(f"device {self.name!r}: speed must be positive, got {self.speed}")
        if not self.memory_bytes > 0:
            raise UserError(f"device {self.name!r}: memory must be positive, got {self.memory_bytes}")
        if not self.bandwidth_bps > 0:
            raise UserError(
                f"device {self.name!r}: link bandwidth must be positive, got {self.bandwidth_bps}"
            )
        if self.first_touch_s_per_byte is not None and not self.first_touch_s_per_byte >= 0:
            raise UserError(f"device {self.name!r}: seconds a byte mapped must not be negative, "
                            f"got {self.first_touch_s_per_byte}")
        if self.cores is not None and not self.cores > 0:
            raise UserError(f"device {self.name!r}: cores must be positive, got {self.cores}")


def _jetson(name: str, relative_to_nano_10w: float, memory_gb: float) -> DeviceSpec:
    return DeviceSpec(
        name=name,
        speed=relative_to_nano_10w * NANO_10W_SPEED,
        memory_bytes=int(memory_gb * GB),
        bandwidth_bps=100 * MBPS,
    )


#: Device presets. Relative speeds (Nano-10W = 1) come from GPU cores x maximum
#: GPU clock in Eco-FL Table 1 and Asteroid Table 5 (Nano: 128 Maxwell cores at
#: 640 / 921.6 MHz; TX2: 256 Pascal cores at 850 MHz / 1.3 GHz; NX: 384 Volta
#: cores at 1.1 GHz), checked against Asteroid Table 1 where a TX2 trains
#: EfficientNet-B1 2.4x and MobileNetV2 2.6x faster than a Nano. Memory is the
#: board's RAM less ~0.5-1 GB for the OS and runtime (the boards share RAM
#: between CPU and GPU). Phone, laptop and Raspberry Pi 4B are rough CPU-only
#: figures for a mixed home.
PRESETS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        _jetson("nano-5w", 640 / 921.6, 3.5),
        _jetson("nano-10w", 1.0, 3.5),
        _jetson("tx2-maxq", 256 * 850 / (128 * 921.6), 7.0),
        _jetson("tx2-maxn", 256 * 1300 / (128 * 921.6), 7.0),
        _jetson("nx", 384 * 1100 / (128 * 921.6), 7.0),
        _jetson("rpi4", 0.25, 3.0),
        _jetson("phone", 0.8, 3.0),
        _jetson("laptop", 2.0, 12.0),
    )
}


def preset(name: str) -> DeviceSpec:
    """The preset called ``name``; an unknown name lists the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(
            f"unknown device preset {name!r}; valid presets: {', '.join(sorted(PRESETS))}"
        ) from None


@dataclass(frozen=True)
class HomePool:
    """A home's devices (device 0 is the portal) and the bandwidth between each pair.

    ``bandwidth_bps[i, j]`` is the bytes/s of the path from device i to device j;
    by default the slower of the two devices' links.
    """

    name: str
    devices: tuple[DeviceSpec, ...]
    bandwidth_bps: np.ndarray = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if not self.devices:
            raise UserError(f"home pool {self.name!r} has no devices")
        n = len(self.devices)
        if self.bandwidth_bps is None:
            links = np.array([d.bandwidth_bps for d in self.devices], dtype=float)
            matrix = np.minimum.outer(links, links)
        else:
            matrix = np.asarray(self.bandwidth_bps, dtype=float)
            if matrix.shape != (n, n):
                raise UserError(
                    f"home pool {self.name!r}: bandwidth matrix must be {n}x{n}, got {matrix.shape}"
                )
            off_diagonal = matrix[~np.eye(n, dtype=bool)]
            if (off_diagonal <= 0).any():
                raise UserError(f"home pool {self.name!r}: every link bandwidth must be positive")
        matrix = matrix.copy()
        np.fill_diagonal(matrix, np.inf)  # a device talks to itself for free
        matrix.setflags(write=False)
        object.__setattr__(self, "bandwidth_bps", matrix)

    def __len__(self) -> int:
        return len(self.devices)

    def with_bandwidth(self, mbps: float) -> "HomePool":
        """The same devices with every link at ``mbps`` megabits per second."""
        if not mbps > 0:
            raise UserError(f"bandwidth must be positive, got {mbps} Mbps")
        devices = tuple(replace(d, bandwidth_bps=mbps * MBPS) for d in self.devices)
        return HomePool(name=self.name, devices=devices)


def make_pool(name: str, device_presets: list[str], bandwidth_mbps: float | None = None) -> HomePool:
    """A pool of preset devices, optionally with every link at ``bandwidth_mbps``."""
    pool = HomePool(name=name, devices=tuple(preset(p) for p in device_presets))
    return pool if bandwidth_mbps is None else pool.with_bandwidth(bandwidth_mbps)


#: The rate the cost model gives a link between two processes of this machine
#: (the home's sealed tensor links on loopback stream about 1 GB/s here:
#: docs/transport.md).
HOST_LINK_BPS = 1e9


def host_pool(pool: HomePool, link_bps: float = HOST_LINK_BPS) -> HomePool:
    """``pool``'s devices as processes of this machine, what a run without emulation is.

    Every device on the CPU computes at the host profile's own speed (1) and
    keeps its memory budget; a device training on a GPU keeps its speed (what
    it measured there, :mod:`ecofl.pipeline.runtime.accelerator_devices`)
    and does the runtime's own work on one host core; every link is loopback
    at ``link_bps``. Pair with the machine's core count (:func:`host_cores`)
    in the cost model, since the devices share its cores.
    """
    devices = tuple(replace(d, bandwidth_bps=link_bps, cores=1.0) if d.accelerator != "cpu"
                    else replace(d, speed=1.0, bandwidth_bps=link_bps, cores=None) for d in pool.devices)
    return HomePool(name=f"{pool.name} (host speed)", devices=devices)


def host_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
