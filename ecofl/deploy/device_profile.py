"""What a device tells its home when it joins: its name, speed, memory and link.

``speed`` is relative to one core of the machine that profiled the model
(ecofl.devices): a device times a fixed training workload
(:func:`workload_seconds`, over at least a second: many CPU-quota periods
on a device confined by a cgroup; a device with a GPU times it on the GPU,
where its worker will train) and the home service, which profiles models on
its own machine, times the same workload on one CPU thread, so speed =
service's time / device's time. It also times how long it takes to map memory for
the first time (a re-plan's first round pays that for the stage it hands
the device: ecofl.pipeline.first_touch). Memory is what the kernel reports
available, within the device's cgroup limit when it runs in one. A device may instead
claim a preset (``--preset nano-10w``): the pipeline then emulates that
board on whatever machine the daemon runs (for tests and demos).

A device with a GPU says so (``accelerator``: ``--accelerator auto``, the
default, finds one; a preset trains on the CPU unless told otherwise), and
its memory is then the GPU's, the planner's budget for its stage. The GPU is
found by a process of its own: the daemon forks its warm workers, and CUDA
must first be used after a fork (:mod:`ecofl.pipeline.runtime.worker_forks`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch import nn

from ecofl.accelerator import finish, resolve_device
from ecofl.own_cgroup import own_device_cores, own_memory_limit_bytes
from ecofl.deploy.service_messages import Register
from ecofl.devices import MBPS, DeviceSpec, preset
from ecofl.errors import UserError
from ecofl.pipeline.runtime.device_timing import seconds_per_call
from ecofl.pipeline.runtime.process_memory import first_touch_cpu_s_per_byte, rss_bytes

_WORKLOAD_REPEATS = 5


def workload_seconds(min_seconds: float = 1.0, accelerator: str = "cpu") -> float:
    """Mean seconds of one forward and backward of a small CNN on 32 images, on one thread, over at least
    ``min_seconds`` (a median of a few short calls would catch a confined device's burst of quota): on the CPU
    in this process, on a GPU (``accelerator``) in a process of its own, where the device's worker will train
    (a daemon must not use CUDA before it forks its workers)."""
    if accelerator == "cpu":
        return workload_seconds_on("cpu", min_seconds)
    return workload_seconds_in_own_process(accelerator, min_seconds)


def workload_seconds_on(device: str, min_seconds: float = 1.0) -> float:
    """:func:`workload_seconds` here on ``device`` (``cpu``, ``cuda``, ``cuda:N``), each call timed after its
    kernels (:func:`ecofl.accelerator.finish`)."""
    where = resolve_device(device, "accelerator")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10)).to(where)
        x = torch.randn(32, 3, 32, 32, generator=generator).to(where)

        def step() -> None:
            model(x).sum().backward()
            finish(where)

        step()  # first-call work, not measured
        return seconds_per_call(step, min_seconds, _WORKLOAD_REPEATS)
    finally:
        torch.set_num_threads(threads)


def workload_seconds_in_own_process(accelerator: str, min_seconds: float = 1.0) -> float:
    """:func:`workload_seconds_on` ``accelerator`` in a child process (a UserError naming it if that fails)."""
    code = (f"from ecofl.deploy.device_profile import workload_seconds_on; "
            f"print(workload_seconds_on({accelerator!r}, {float(min_seconds)!r}))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as error:
        raise UserError(f"could not time the workload on {accelerator}: {error}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise UserError(f"could not time the workload on {accelerator}: {last}")
    return float(lines[-1])


def first_touch_seconds_per_byte() -> float:
    """Seconds this machine takes to map a byte of memory for the first time, as a worker does in a new stage's
    first round (ecofl.pipeline.first_touch): the CPU of a fresh mapping's first write beyond its second, per
    byte (:func:`~ecofl.pipeline.runtime.process_memory.first_touch_cpu_s_per_byte`, as a calibrating device
    measures it), over the CPU quota of the device cgroup it runs in (if any)."""
    per_byte = first_touch_cpu_s_per_byte()
    cores = own_device_cores()
    return per_byte if cores is None else per_byte / cores


def available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (Linux; else the total physical memory), within this process's cgroup
    limit less what it uses now."""
    available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = own_memory_limit_bytes()
    return available if limit is None else max(0, min(available, limit - (rss_bytes() or 0)))


#: Run in a process of its own: the GPUs this machine's torch sees, and each one's memory.
_GPU_PROBE = ("import json, torch; print(json.dumps([torch.cuda.get_device_properties(i).total_memory "
              "for i in range(torch.cuda.device_count())]))")


def gpu_memories() -> list[int]:
    """The memory of each GPU this machine's torch sees ([] without an NVIDIA driver, asked of nothing then)."""
    if not Path("/proc/driver/nvidia").exists():
        return []
    try:
        out = subprocess.run([sys.executable, "-c", _GPU_PROBE], capture_output=True, text=True, timeout=120,
                             check=True).stdout
        return [int(m) for m in json.loads(out.strip().splitlines()[-1])]
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return []


def describe_device(name: str, preset_name: str | None, bandwidth_mbps: float, accelerator: str = "auto",
                    gpus: list[int] | None = None) -> Register:
    """The registration a daemon sends: a preset's numbers, or this machine's measured ones; ``accelerator``
    ``auto`` (a GPU if there is one, the CPU for a preset), ``cpu``, ``cuda`` or ``cuda:N``. ``gpus``: the GPUs'
    memories, found by :func:`gpu_memories` unless given."""
    if accelerator == "auto" and preset_name is not None:
        accelerator = "cpu"
    if accelerator != "cpu":
        gpus = gpu_memories() if gpus is None else gpus
    if accelerator == "auto":
        accelerator = "cuda" if gpus else "cpu"
    memory = None  # a GPU's: the budget of its stage
    if accelerator != "cpu":
        index = int(accelerator.partition(":")[2] or 0)
        if index >= len(gpus):
            raise UserError(f"device {name}: accelerator {accelerator}, but this machine has {len(gpus)} GPU(s)")
        memory = gpus[index]
    if preset_name is not None:
        spec = preset(preset_name)
        return Register(name, preset_name, spec.memory_bytes, bandwidth_mbps * MBPS, speed=spec.speed,
                        accelerator=accelerator)
    memory = available_memory_bytes() if memory is None else memory
    return Register(name, None, memory, bandwidth_mbps * MBPS, workload_s=workload_seconds(accelerator=accelerator),
                    accelerator=accelerator, first_touch_s_per_byte=first_touch_seconds_per_byte())


def device_spec(registration: Register, reference_workload_s: float) -> DeviceSpec:
    """The :class:`DeviceSpec` of a registration (measured speed relative to ``reference_workload_s``)."""
    speed = registration.speed
    if speed is None:
        if registration.workload_s is None or registration.workload_s <= 0:
            raise ValueError(f"register: {registration.name!r} gives neither a speed nor a positive workload time")
        speed = reference_workload_s / registration.workload_s
    return DeviceSpec(name=registration.name, speed=speed, memory_bytes=registration.memory_bytes,
                      bandwidth_bps=registration.bandwidth_bps, accelerator=registration.accelerator,
                      first_touch_s_per_byte=registration.first_touch_s_per_byte)
