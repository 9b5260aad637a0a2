"""A home's GPU devices time their work on their GPUs before the plan is made (issue 42): what runs anywhere.

The timing itself is :func:`~ecofl.pipeline.runtime.calibration.measure_speeds`'
(a process per device, no cgroup); here devices on the CPU stand in for GPU
ones (``AcceleratorDevices(pool, devices)``), the way a GPU device's process
is started and read. On a GPU machine, ``benchmarks/pipeline_accelerators.py``
runs it on ``cuda`` (docs/pipeline_accelerators.md).
"""

from __future__ import annotations

import pytest

from ecofl.cgroups import DeviceLimits
from ecofl.devices import GB, DeviceSpec, HomePool, host_pool
from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.profile import profile_model
from ecofl.pipeline.runtime import LayerList
from ecofl.pipeline.runtime.accelerator_devices import (
    AcceleratorDevices, AcceleratorLimits, calibrate_accelerators, has_accelerators,
)
from ecofl.pipeline.runtime.calibration import ConfinedPool, Work, calibrated_on, measure_speeds

from pipeline_kit import synthetic_profile

pytestmark = pytest.mark.timeout(300)

MODEL = LayerList((
    ("Conv2d", {"in_channels": 3, "out_channels": 8, "kernel_size": 3, "padding": 1}),
    ("ReLU", {}),
    ("Conv2d", {"in_channels": 8, "out_channels": 8, "kernel_size": 3, "padding": 1}),
    ("AdaptiveAvgPool2d", {"output_size": 1}),
    ("Flatten", {}),  # 8 logits
))
SHAPE = (3, 16, 16)


def gpu_home() -> HomePool:
    return HomePool("mixed", (DeviceSpec("pi", 0.1, GB, 1e8), DeviceSpec("desk-gpu", 1.0, 8 * GB, 1e8, "cuda"),
                              DeviceSpec("laptop-gpu", 1.0, 8 * GB, 1e8, "cuda:0")))


def test_only_a_pools_gpu_devices_calibrate_and_each_is_known_by_its_gpu_and_budget():
    devices = AcceleratorDevices(gpu_home())
    assert devices.limits == {1: AcceleratorLimits(1.0, 8 * GB, "cuda"), 2: AcceleratorLimits(1.0, 8 * GB, "cuda:0")}
    assert has_accelerators(gpu_home()) and not has_accelerators(HomePool("cpus", gpu_home().devices[:1]))
    # a GPU device is never mistaken for a confined CPU device of the same cores and memory
    assert AcceleratorLimits(1.0, GB, "cuda") != AcceleratorLimits(1.0, GB, "cuda:1")
    assert AcceleratorLimits(1.0, GB, "cpu") != DeviceLimits(1.0, GB)
    group, env = devices.enter(1)
    assert group.entry_command() == [] and env["OMP_NUM_THREADS"] == "1"
    assert not devices.out_of_memory(1)


def test_at_host_speed_a_gpu_device_keeps_the_speed_it_measured_and_works_the_runtime_on_one_core():
    pool = HomePool("mixed", (DeviceSpec("pi", 0.1, GB, 1e8), DeviceSpec("gpu", 37.5, 8 * GB, 1e8, "cuda")))
    host = host_pool(pool)
    assert [d.speed for d in host.devices] == [1.0, 37.5]
    assert [d.cores for d in host.devices] == [None, 1.0] and host.devices[1].cpu_speed == 1.0


def test_the_runtimes_work_around_a_gpu_devices_operation_is_charged_on_its_host_core():
    """A GPU device's layers at its measured speed, the runtime's time per operation at one host core; a CPU
    device's both at its speed (a confined device's calibrated speed carries that work)."""
    profile = synthetic_profile(3)
    gpu = DeviceSpec("gpu", 20.0, GB, 1e8, "cuda", cores=1.0)
    cpu = DeviceSpec("pi", 0.5, GB, 1e8)
    layers_gpu = stage_compute_s(profile, gpu, (0, 2), 4)
    assert stage_compute_s(profile, gpu, (0, 2), 4, 0.001) == pytest.approx(tuple(t + 0.001 for t in layers_gpu))
    layers_cpu = stage_compute_s(profile, cpu, (0, 2), 4)
    assert stage_compute_s(profile, cpu, (0, 2), 4, 0.001) == pytest.approx(tuple(t + 0.002 for t in layers_cpu))
    assert gpu.operation_speed == 1.0 and cpu.operation_speed == 0.5


def test_devices_time_their_work_as_processes_of_this_machine_and_the_others_keep_their_speed():
    """Devices 1 and 2 (on the CPU here, standing in for GPU devices) time the whole model at 4 samples without
    a cgroup; device 0 is not timed. The two alike share one measurement; the speed is against the host
    profile's step, so a host-speed device measures near one core."""
    pool = HomePool("home", (DeviceSpec("pi", 0.1, GB, 1e8), *(DeviceSpec("twin", 1.0, GB, 1e8),) * 2))
    layers = MODEL.build()[1]
    profile = profile_model(layers, SHAPE, (4,), name="accelerator-devices-convolutions", repeats=3)
    measured, report = measure_speeds(MODEL, SHAPE, profile, pool, AcceleratorDevices(pool, [1, 2]), 4,
                                      min_seconds=0.5)
    assert sorted(report) == [1, 2]
    assert measured.devices[0] == pool.devices[0]
    assert measured.devices[1].speed == measured.devices[2].speed  # twins: one mean
    assert 0.1 < measured.devices[1].speed < 10, report  # one thread of this host, on the host profile's work
    assert measured.devices[1].cores == 1.0 and report[1]["micro_batch"] == 4 and report[1]["layers"] is None
    assert report[1]["own_step_s"] > 0 and report[1]["step_s"] == pytest.approx(
        (report[1]["own_step_s"] + report[2]["own_step_s"]) / 2)


def test_a_plan_that_moves_only_cpu_devices_needs_no_new_gpu_measurement():
    """A GPU home's CPU devices do not calibrate: a workload whose GPU devices' work was timed is known, whatever
    its CPU devices' work."""
    pool = gpu_home()
    timed = ((0, Work(4)), (1, Work(4, (0, 2))), (2, Work(4, (3, 4))))
    reports = {d: {"micro_batch": 4, "layers": list(w.layers), "measured_speed": 30.0, "quota_cores": 1.0}
               for d, w in timed[1:]}
    limits = AcceleratorDevices(pool).limits
    calibrated = {timed: ConfinedPool(pool, limits, reports, timed)}
    moved = ((0, Work(2, (0, 0))), (1, Work(4, (0, 2))), (2, Work(4, (3, 4))))

    def must_not_measure(workload):
        raise AssertionError(f"measured again: {workload}")

    known = calibrated_on(moved, calibrated, must_not_measure)
    assert [d.speed for d in known.pool.devices] == [0.1, 30.0, 30.0]


def test_a_pool_without_gpu_devices_times_nothing():
    pool = HomePool("cpus", (DeviceSpec("pi", 0.1, GB, 1e8),))
    layers = MODEL.build()[1]
    profile = profile_model(layers, SHAPE, (4,), name="accelerator-devices-convolutions", repeats=3)
    confined = calibrate_accelerators(MODEL, SHAPE, profile, pool, 4, min_seconds=0.5)
    assert confined.pool == pool and confined.measured == {} and confined.limits == {}
