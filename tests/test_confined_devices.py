"""Devices confined by cgroups (``--emulate cgroup``): real CPU quotas and memory limits, nothing slept to a model.

The first tests check the cgroup files written, on a fake cgroup tree, and
run anywhere. The rest confine real worker processes and skip, with the
reason, where this machine's cgroups are not writable (not root, or no cpu
and memory controllers).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ecofl import cgroups, own_cgroup
from ecofl.cgroups import DeviceLimits, Hierarchy, cpu_bandwidth, find_hierarchy
from ecofl.devices import GB, DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.profile import profile_model
from ecofl.pipeline.runtime import LayerList
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.runtime.calibration import (
    ConfinedPool,
    Work,
    Workload,
    calibrated_on,
    describe_workload,
    measure_speeds,
    measured_pool,
    operating_micro_batch,
    plan_on_measured_speeds,
    plan_workload,
    shared_by_identical,
    shared_by_kind,
    speed_from_step,
    whole_model,
    whole_model_at_shares,
)
from ecofl.pipeline.runtime.confinement import Confinement, check_fits, pool_limits
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.errors import DeviceOutOfMemory
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
from ecofl.pipeline.runtime.pipe_messages import CALIBRATION_REPLIES, Go, line_of, read_line
from ecofl.pipeline.runtime.portal import HomePipeline
from helpers import CGROUPS as FOUND, needs_cgroups
from pipeline_kit import FAST_HEARTBEAT, THREE_STAGES, assert_gone, synthetic_profile
from processes import worker_processes

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def convolutions(side: int) -> LayerList:
    """Five layers (THREE_STAGES' cut) whose operations take milliseconds, not microseconds: what a quota
    throttles (an operation shorter than the 1 ms quota runs at host speed whatever the quota)."""
    return LayerList((
        ("Conv2d", {"in_channels": 3, "out_channels": 16, "kernel_size": 3, "padding": 1}),
        ("ReLU", {}),
        ("Conv2d", {"in_channels": 16, "out_channels": 16, "kernel_size": 3, "padding": 1}),
        ("AdaptiveAvgPool2d", {"output_size": 1}),
        ("Flatten", {}),  # 16 logits
    ))


def images(n: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 3, side, side, generator=generator), torch.randint(0, 16, (n,), generator=generator)


# -- the files written (a fake cgroup tree) ------------------------------------------------------------


def test_the_quota_is_1_ms_per_period_so_no_idle_device_bursts_for_long():
    assert cpu_bandwidth(0.1) == (1000, 10000)
    assert cpu_bandwidth(0.25) == (1000, 4000)
    assert cpu_bandwidth(1.5) == (1500, 1000)
    quota, period = cpu_bandwidth(0.0694)
    assert quota == 1000 and quota / period == pytest.approx(0.0694, rel=1e-3)
    with pytest.raises(ValueError):
        cpu_bandwidth(0)


def fake_tree(root: Path, version: int) -> Hierarchy:
    """Directories that look like cgroups: every file the code writes exists and is empty."""
    if version == 1:
        cpu, memory = root / "cpu" / "me", root / "memory" / "me"
        for path in (cpu, memory):
            path.mkdir(parents=True)
        (root / "cpu" / "me" / "cgroup.procs").write_text("")
        return Hierarchy(1, cpu, memory)
    root.mkdir(exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return Hierarchy(2, root, root)


@pytest.mark.parametrize("version", [1, 2])
def test_a_device_cgroup_gets_its_quota_and_memory_limit_in_each_version(tmp_path, version):
    group = fake_tree(tmp_path, version).create("device1", DeviceLimits(0.2, 3 * GB))
    if version == 1:
        assert (group.cpu_dir / "cpu.cfs_quota_us").read_text() == "1000"
        assert (group.cpu_dir / "cpu.cfs_period_us").read_text() == "5000"
        assert (group.memory_dir / "memory.limit_in_bytes").read_text() == str(3 * GB)
        assert group.cpu_dir.parent.parent.name == "cpu" and group.memory_dir.parent.parent.name == "memory"
    else:
        assert (group.cpu_dir / "cpu.max").read_text() == "1000 5000"
        assert (group.cpu_dir / "memory.max").read_text() == str(3 * GB)
    assert group.cores == pytest.approx(0.2) and group.cpu_dir.name.startswith("ecofl-")
    group.set_cores(0.05)  # a quota cut
    assert group.cores == pytest.approx(0.05)


@pytest.mark.parametrize("version", [1, 2])
def test_a_process_reads_the_quota_of_its_own_device_cgroup_and_none_elsewhere(tmp_path, version):
    group = fake_tree(tmp_path, version).create("device1", DeviceLimits(0.2, 3 * GB))
    inside = (f"4:cpu,cpuacct:/me/{group.cpu_dir.name}\n5:memory:/me/{group.cpu_dir.name}\n" if version == 1
              else f"0::/{group.cpu_dir.name}\n")
    assert own_cgroup.own_device_cores(tmp_path, inside) == pytest.approx(0.2)
    group.set_cores(0.05)  # a load spike: the device's own pace follows
    assert own_cgroup.own_device_cores(tmp_path, inside) == pytest.approx(0.05)
    outside = "4:cpu,cpuacct:/me\n5:memory:/me\n" if version == 1 else "0::/user.slice\n"
    assert own_cgroup.own_device_cores(tmp_path, outside) is None


@pytest.mark.parametrize("version", [1, 2])
def test_how_long_cfs_held_a_device_throttled_is_read_from_its_cpu_stat(tmp_path, version):
    group = fake_tree(tmp_path, version).create("device1", DeviceLimits(0.2, 3 * GB))
    assert group.throttling() == {}  # the kernel said nothing (yet)
    held = "throttled_time 2500000000" if version == 1 else "usage_usec 9\nthrottled_usec 2500000"
    (group.cpu_dir / "cpu.stat").write_text(f"nr_periods 400\nnr_throttled 120\n{held}\n")
    assert group.throttling() == {"cfs_periods": 400, "cfs_throttled_periods": 120, "cfs_throttled_s": 2.5}


def test_removing_a_cgroup_kills_a_process_that_joined_after_the_last_look(tmp_path, monkeypatch):
    """A worker forked into the cgroup as it is removed (a Ctrl-C in between) makes rmdir busy: kill it, retry."""
    group = fake_tree(tmp_path, 2).create("device1", DeviceLimits(0.2, 3 * GB))
    latecomer = subprocess.Popen(["sleep", "60"])
    looks = []
    busy = [OSError(errno.EBUSY, "Device or resource busy")]

    def pids() -> list[int]:  # empty at the first look; then the latecomer until it is dead
        looks.append(len(looks))
        return [] if len(looks) == 1 or latecomer.poll() is not None else [latecomer.pid]

    def rmdir(path: Path, deadline: float) -> None:
        if busy:
            raise busy.pop()

    monkeypatch.setattr(group, "pids", pids)
    monkeypatch.setattr(cgroups, "_rmdir", rmdir)
    try:
        group.remove(timeout_s=30)
        assert latecomer.wait(timeout=30) == -signal.SIGKILL and not busy
    finally:
        latecomer.kill()


@needs_cgroups
def test_a_real_memory_limit_can_be_raised_above_and_lowered_below_the_one_it_started_with():
    """cgroup v1 with swap accounting refuses a memory limit above memory+swap's: a device whose start-up
    allocations exceeded the allowance could not be given its budget on top of them (EINVAL)."""
    group = FOUND.create("raise-test", DeviceLimits(0.5, 64 * MIB))
    try:
        for limit in (512 * MIB, 32 * MIB):
            group.set_memory(limit)
            assert group.memory_limit_bytes == limit
            limit_file = "memory.max" if FOUND.version == 2 else "memory.limit_in_bytes"
            assert int((group.memory_dir / limit_file).read_text()) == limit
    finally:
        group.remove()


def test_the_hierarchy_found_is_named_and_a_missing_one_is_a_reason(tmp_path):
    v1 = tmp_path / "v1"
    for controller in ("cpu", "memory"):
        (v1 / controller / "slice").mkdir(parents=True)
    found = find_hierarchy(v1, "4:memory:/slice\n1:cpu:/slice\n0::/\n")
    assert isinstance(found, Hierarchy) and found.name == "cgroup v1"
    assert found.memory == v1 / "memory" / "slice"
    v2 = tmp_path / "v2"
    fake_tree(v2, 2)
    (v2 / "ecofl-devices").mkdir()  # the kernel would fill a new cgroup directory with its files
    (v2 / "ecofl-devices" / "cgroup.subtree_control").write_text("")
    found = find_hierarchy(v2, "0::/\n")
    assert isinstance(found, Hierarchy) and found.name == "cgroup v2"
    assert "+cpu +memory" in (v2 / "cgroup.subtree_control").read_text()
    assert isinstance(find_hierarchy(tmp_path / "none"), str)


def test_devices_calibrate_at_the_samples_each_computes_per_call():
    chain = Plan("chain", (StagePlan((0, 1), (0,), (8,), 2), StagePlan((2, 3), (1,), (8,), 1)), 8, 4)
    replicated = Plan("hpp", (StagePlan((0, 1), (0, 1), (4, 4), 2), StagePlan((2, 3), (2,), (8,), 1)), 8, 4)
    data_parallel = Plan("dp", (StagePlan((0, 3), (0, 1, 2), (26, 26, 24), 1),), 76, 1)
    assert operating_micro_batch(chain) == 8
    assert operating_micro_batch(replicated) == 4
    assert operating_micro_batch(data_parallel) == 26


def two_stages(cut: int, micro_batch: int = 8) -> Plan:
    return Plan("two", (StagePlan((0, cut), (0,), (micro_batch,), 2), StagePlan((cut + 1, 3), (1,), (micro_batch,), 1)),
                micro_batch, 4)


def test_a_plan_gives_each_device_its_stage_to_time_and_an_idle_device_the_whole_model():
    replicated = Plan("hpp", (StagePlan((0, 1), (0, 1), (4, 4), 2), StagePlan((2, 3), (2,), (8,), 1)), 8, 4)
    assert plan_workload(replicated, range(4)) == (
        (0, Work(4, (0, 1))), (1, Work(4, (0, 1))), (2, Work(8, (2, 3))), (3, Work(4)))
    assert describe_workload(plan_workload(two_stages(1), range(2))) == "0: 0-1 x8, 1: 2-3 x8"
    assert describe_workload(whole_model(range(3), 4)) == "whole model x4"


def test_each_device_times_the_whole_model_alone_at_the_samples_it_computes_per_call_in_the_plan():
    """The devices' own throughput beside which a pipeline's efficiency is its schedule's: a replica at its
    share, a device of a stage at the micro-batch, one the plan leaves idle at the operating micro-batch; a
    workload measured already (by devices confined alike) is not measured again."""
    replicated = Plan("hpp", (StagePlan((0, 1), (0, 1), (2, 6), 2), StagePlan((2, 3), (2,), (8,), 1)), 8, 4)
    assert whole_model_at_shares(replicated, range(4)) == ((0, Work(2)), (1, Work(6)), (2, Work(8)), (3, Work(6)))
    limits = {d: DeviceLimits(1.0, GB) for d in range(2)}
    measured: list[Workload] = []

    def measure(workload: Workload) -> ConfinedPool:
        measured.append(workload)
        reports = {d: {"micro_batch": work.samples, "layers": None, "step_s": 1.0} for d, work in workload}
        return ConfinedPool(HomePool("home", (DeviceSpec("a", 1.0, GB, 1e9),) * 2), limits, reports, workload)

    cache: dict[Workload, ConfinedPool] = {}
    chain = whole_model_at_shares(two_stages(1), range(2))
    assert calibrated_on(chain, cache, measure).workload == chain == whole_model(range(2), 8)
    assert calibrated_on(whole_model(range(2), 8), cache, measure) is cache[chain] and measured == [chain]
    calibrated_on(whole_model(range(2), 4), cache, measure)
    assert measured == [chain, whole_model(range(2), 4)]


def test_devices_time_the_whole_model_then_their_own_stages_and_the_plan_is_predicted_on_those():
    """The plan on whole-model speeds cuts after layer 1; on its stages device 0 measures slower, and the plan on
    those speeds cuts after layer 0: measured there too. Of the plans made, the one the cost model predicts
    fastest at the speeds its own devices showed on its own stages is returned, with those speeds (a fixed
    point, a cycle, a plan made on another plan's speeds that turns out slower, and a cache that measures
    nothing twice). Four equal layers: a stage's time is its layers over its device's speed."""
    presets = HomePool("home", (DeviceSpec("a", 1.0, GB, 1e9),) * 2)
    profile = synthetic_profile(4)
    measured: list[Workload] = []
    whole, cut_1, cut_0 = whole_model(range(2), 8), plan_workload(two_stages(1), range(2)), \
        plan_workload(two_stages(0), range(2))

    def measure(workload: Workload, speeds: dict[Workload, tuple[float, float]]) -> ConfinedPool:
        measured.append(workload)
        pool = with_speeds(presets, dict(enumerate(speeds[workload])))
        return ConfinedPool(pool, {0: DeviceLimits(1.0, GB), 1: DeviceLimits(1.0, GB)}, {}, workload)

    def plan_for(pool: HomePool) -> Plan:
        return two_stages(1 if pool.devices[0].speed >= pool.devices[1].speed else 0)

    def run(speeds: dict[Workload, tuple[float, float]], cache=None) -> tuple[ConfinedPool, Plan]:
        measured.clear()
        return plan_on_measured_speeds(plan_for, profile, presets, lambda w: measure(w, speeds), cache)

    # cut 1 on its stages: 2 layers / 0.4 = 5 units; cut 0 on its own: max(1 / 0.4, 3 / 0.8) = 3.75
    confined, plan = run({whole: (0.5, 0.5), cut_1: (0.4, 0.6), cut_0: (0.4, 0.8)})
    assert measured == [whole, cut_1, cut_0] and plan == two_stages(0) and confined.workload == cut_0
    # cut 0 on its own stages plans cut 1 again (a cycle); cut 0 there: max(1 / 0.7, 3 / 0.5) = 6 > 5
    cache: dict[Workload, ConfinedPool] = {}
    confined, plan = run({whole: (0.5, 0.5), cut_1: (0.4, 0.6), cut_0: (0.7, 0.5)}, cache)
    assert measured == [whole, cut_1, cut_0] and plan == two_stages(1) and confined.workload == cut_1
    assert [d.speed for d in confined.pool.devices] == [0.4, 0.6]
    run({}, cache)
    assert measured == []
    # cut 0, planned on cut 1's speeds, is slower on its own (max(1 / 0.2, 3 / 0.5) = 6): cut 1 is kept
    confined, plan = run({whole: (0.5, 0.5), cut_1: (0.4, 0.6), cut_0: (0.2, 0.5)})
    assert measured == [whole, cut_1, cut_0] and plan == two_stages(1) and confined.workload == cut_1


def test_at_its_measured_speed_the_cost_model_predicts_a_step_as_measured_per_operation_overhead_included():
    """The cost model charges each forward and backward the runtime's overhead at the device's speed
    (ecofl.pipeline.cost). A speed of the layers alone over the measured step charged the step's per-call costs
    twice, the second time at a speed they had lowered: a stage of small layers on a small quota (here 0.24 ms of
    layers measured at 50 ms a step) was predicted at a multiple of what it measured."""
    from ecofl.pipeline.cost import stage_compute_s

    profile = synthetic_profile(4)
    profile = dataclasses.replace(profile, forward_s=profile.forward_s / 1000, backward_s=profile.backward_s / 1000)
    forward, backward = profile.layer_times(4)
    layers_s = float(forward[2:4].sum() + backward[2:4].sum())
    overhead_s, measured_s = 0.5e-3, 0.05
    for objective, operations in (("training", 2), ("inference", 1)):
        speed = speed_from_step(profile, Work(4, (2, 3)), measured_s, objective, overhead_s)
        f, b = stage_compute_s(profile, DeviceSpec("rpi", speed, GB, 1e9), (2, 3), 4)
        predicted = f + (b if objective == "training" else 0.0) + operations * overhead_s / speed
        assert predicted == pytest.approx(measured_s)
    alone = speed_from_step(profile, Work(4, (2, 3)), measured_s)  # the layers alone: the overhead counted twice
    assert layers_s / alone + 2 * overhead_s / alone > 1.5 * measured_s


def test_a_device_that_will_stream_times_eval_mode_forwards_and_its_speed_counts_forwards_only():
    """PipeEdge's devices only run forwards: calibrated on them (eval mode, no autograd), a device's speed is the
    profile's forwards over its measured step, so the stream model's forwards add up to what it measured."""
    model, side = convolutions(16), 16
    profile = profile_model(model.build()[1], (3, side, side), (4, 8), name="calibration-convolutions", repeats=2)
    forward, backward = profile.layer_times(4)
    assert speed_from_step(profile, 4, 0.01, "inference") == pytest.approx(forward.sum() / 0.01)
    assert speed_from_step(profile, 4, 0.01) == pytest.approx((forward.sum() + backward.sum()) / 0.01)
    command = [sys.executable, "-m", "ecofl.pipeline.runtime.device_timing", "--model", json.dumps(model.to_json()),
               "--input-shape", f"3,{side},{side}", "--micro-batch", "4", "--seconds", "0.2",
               "--objective", "inference"]
    out = subprocess.run(command, input=line_of(Go()), capture_output=True, text=True, check=True, timeout=120,
                         cwd=ROOT)
    ready, measured = (read_line(line, CALIBRATION_REPLIES) for line in out.stdout.splitlines())
    assert ready.seconds_per_step is None and measured.seconds_per_step > 0  # ready, then timed
    assert ready.first_touch_cpu_s_per_byte is None or ready.first_touch_cpu_s_per_byte >= 0
    assert speed_from_step(profile, Work(4, (2, 3)), 0.01) == pytest.approx(
        (forward[2:4].sum() + backward[2:4].sum()) / 0.01)
    stage = [*command[:command.index("--objective")], "--layers", "2,3"]  # a middle stage, trained on a gradient
    out = subprocess.run(stage, input=line_of(Go()), capture_output=True, text=True, check=True, timeout=120, cwd=ROOT)
    ready, measured = (read_line(line, CALIBRATION_REPLIES) for line in out.stdout.splitlines())
    assert ready.seconds_per_step is None and measured.seconds_per_step > 0  # ready, then timed
    assert ready.first_touch_cpu_s_per_byte is None or ready.first_touch_cpu_s_per_byte >= 0
    refused = subprocess.run([*command, "--layers", "3,9"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert refused.returncode != 0 and "the model has layers 0-4" in refused.stderr
    with pytest.raises(ValueError, match="objective must be one of training, inference"):
        measure_speeds(model, (3, side, side), profile, HomePool("p", (DeviceSpec("a", 0.4, GB, 1e9),)), None, 4,
                       objective="serving")


def test_a_pool_whose_quotas_do_not_fit_this_machine_is_refused():
    check_fits({0: DeviceLimits(0.5, GB), 1: DeviceLimits(0.9, GB)}, cores=2)
    with pytest.raises(UserError, match=r"add up to 1.6 cores .* less 0.5 for the portal"):
        check_fits({0: DeviceLimits(0.7, GB), 1: DeviceLimits(0.9, GB)}, cores=2)


def test_the_emulation_modes_parse_from_their_names_only():
    assert Emulation.parse("cgroup") == Emulation.CGROUP and Emulation.parse(Emulation.NONE) == Emulation.NONE
    for wrong in ("docker", True, False):  # no flag: True used to mean "sleep"
        with pytest.raises(UserError, match="valid: cgroup, sleep, none"):
            Emulation.parse(wrong)


# -- real cgroups --------------------------------------------------------------------------------------


def our_cgroups() -> list[str]:
    """Every cgroup of ecofl's under this process's own (all tests' processes: names carry their pid)."""
    if isinstance(FOUND, str):
        return []
    return sorted({path.name for parent in {FOUND.cpu, FOUND.memory} for path in parent.glob("ecofl-*")})


def mine() -> list[str]:
    import os

    return [name for name in our_cgroups() if name.startswith(f"ecofl-{os.getpid()}-")]


@needs_cgroups
def test_ecofl_home_train_confined_reports_quota_limit_and_real_memory_and_leaves_nothing(tmp_path):
    """The issue's must-show, on the small CNN: emulation cgroup, measured against predicted, per device its
    quota, memory limit and peak resident set; afterwards no cgroup and no worker."""
    command = [sys.executable, "-m", "ecofl.cli", "home", "train", "--model", "cnn", "--pool",
               "nano-10w,nano-10w,tx2-maxq", "--dataset", "digits", "--batch", "32", "--rounds", "3",
               "--emulate", "cgroup", "--json", "--cache-dir", str(tmp_path)]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["emulation"] == "cgroup"
    assert report["sync_round_s"] > 0 and report["predicted_sync_round_s"] > 0
    used = report["devices"]
    assert used, report
    for device in used:
        assert device["cgroup"].startswith("cgroup v")
        assert device["cpu_quota"] == pytest.approx(device["quota_cores"], rel=0.01)
        assert device["memory_limit_bytes"] > device["memory_budget_bytes"]  # the budget on top of the runtime
        assert device["peak_rss_bytes"] > 0 and device["measured_speed"] > 0
        assert device["first_touch_s_per_byte"] is None or device["first_touch_s_per_byte"] >= 0  # calibrated
        # its calibration's CPU a step, all its threads: within what its quota allows over the step's time
        assert 0 < device["own_cpu_s_per_step"] <= 1.5 * device["cpu_quota"] * device["own_step_s"]
    first = report["predicted_first_round_s"]  # None only where a device's first step mapped nothing
    assert (first is None) == any(d["first_touch_s_per_byte"] is None for d in used)
    assert first is None or first >= report["predicted_sync_round_s"]
    print(f"\nconfined cnn on nano,nano,tx2-maxq: sync-round {report['sync_round_s']:.3f} s measured, "
          f"{report['predicted_sync_round_s']:.3f} s predicted; speeds measured "
          + ", ".join(f"{d['name']} {d['measured_speed']:.3f} (quota {d['cpu_quota']:.3f})" for d in used))
    assert not left_behind()
    assert not worker_processes(None)


@needs_cgroups
def test_ecofl_home_infer_confined_streams_on_measured_speeds(tmp_path):
    command = [sys.executable, "-m", "ecofl.cli", "home", "infer", "--model", "cnn", "--pool", "nano-10w,tx2-maxn",
               "--dataset", "digits", "--samples", "64", "--emulate", "cgroup", "--json", "--cache-dir", str(tmp_path)]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["emulation"] == "cgroup" and report["samples"] == 64
    assert report["throughput"] > 0 and report["predicted_throughput"] > 0
    print(f"\nconfined inference of cnn: {report['throughput']:.1f} samples/s measured, "
          f"{report['predicted_throughput']:.1f} predicted")
    assert not left_behind()


def left_behind() -> list[str]:
    """The cgroups of ecofl processes that have ended (each is named ecofl-<its pid>-...)."""
    return [name for name in our_cgroups() if not Path(f"/proc/{name.split('-')[1]}").exists()]


@needs_cgroups
def test_a_worker_over_its_real_memory_limit_is_named_out_of_memory_and_nothing_is_left():
    """A device whose budget cannot hold even its activations: the kernel kills its worker at the limit, the
    portal says which device and that it ran out of memory (not that it crashed), and everything is gone."""
    x, y = images(64, 128)  # device 1's input alone is 64 MiB
    tiny = HomePool("tiny", (DeviceSpec("roomy", 0.3, 2 * GB, 1e9), DeviceSpec("tiny", 0.3, 32 << 20, 1e9),
                             DeviceSpec("roomy", 0.3, 2 * GB, 1e9)))
    # one micro-batch of 64: the most activations at once
    plan = Plan("hand", tuple(dataclasses.replace(s, shares=(64,)) for s in THREE_STAGES.stages), 64, 1)
    pids: list[int] = []
    with pytest.raises(DeviceOutOfMemory, match=r"device 1 \(tiny\) ran out of memory") as raised:
        with HomePipeline(convolutions(128), tiny, plan, emulate="cgroup", timeout_s=120) as home:
            pids = list(home.worker_pids.values())
            home.train(None, x, y, 2, lr=0.1)
    assert "kernel killed its worker" in str(raised.value)
    assert_gone(pids)
    assert not mine()


@needs_cgroups
def test_a_device_the_plan_left_out_joins_in_its_own_cgroup_and_the_result_is_exact():
    """Device selection may leave a device out of the plan (no worker); one that joins later (``join:D@R``) runs
    confined like the others. Its limits were once only the plan's devices', and its join failed (KeyError)."""
    from pipeline_kit import PROFILE, WITHOUT_BATCH_NORM, assert_same, data, single_process

    home3 = HomePool("three", tuple(DeviceSpec(f"d{i}", 0.2, GB, 1e9) for i in range(3)))
    two_stages = Plan("hand", (StagePlan((0, 2), (0,), (4,), 3), StagePlan((3, 4), (1,), (4,), 1)), 4, 6)
    x, y = data()
    with HomePipeline(WITHOUT_BATCH_NORM, home3, two_stages, profile=PROFILE, emulate="cgroup", timeout_s=120,
                      fault_tolerance=FaultTolerance(heartbeat=FAST_HEARTBEAT)) as home:
        start = home.weights
        result = home.train(None, x, y, 6, lr=0.1, inject=[Injection.parse("join:2@3")])
        final_plan, confined = home.plan, home.confinement_report()
    [event] = result.events
    assert event["kind"] == "join" and event["device"] == 2
    assert 2 in {d for stage in final_plan.stages for d in stage.devices}
    assert confined[2]["cpu_quota"] == pytest.approx(0.2, rel=0.05)
    assert_same(single_process(WITHOUT_BATCH_NORM, start, x, y, two_stages, 6, lr=0.1), result.weights)


@needs_cgroups
def test_a_quota_cut_is_detected_from_measured_times_and_the_slowed_device_gets_less_work():
    """Eco-FL §4.4 for real: device 1's quota is divided by 4 at round 2 (the portal is not told); the portal
    sees its compute times grow and re-plans it to less work."""
    model, side = convolutions(64), 64
    x, y = images(64, side)
    presets = HomePool("even", (DeviceSpec("a", 0.4, GB, 1e9),) * 3)
    layers = model.build()[1]
    profile = profile_model(layers, (3, side, side), (4, 8), name=f"confined-convolutions-{side}", repeats=3)
    limits = pool_limits(presets)
    measured, _ = measure_speeds(model, (3, side, side), profile, presets, Confinement(limits), 4, min_seconds=1.0)
    ft = FaultTolerance(heartbeat=FAST_HEARTBEAT)
    with HomePipeline(model, measured, THREE_STAGES, profile=profile, emulate="cgroup", limits=limits,
                      timeout_s=120, fault_tolerance=ft) as home:
        quota_before = home.confinement_report()[1]["cpu_quota"]
        result = home.train(None, x, y, 8, lr=0.1, inject=[Injection.parse("slow:1*4@2")])
        final_plan, quota_after = home.plan, home.confinement_report()[1]["cpu_quota"]
    assert quota_after == pytest.approx(quota_before / 4, rel=0.05)
    # the injected cut is device 1's first event; a loaded host may slow any device (device 1 on its new plan
    # too) past the threshold later: such a device is re-planned as slow, never taken for lost
    event = next(e for e in result.events if e["device"] == 1)
    assert event["kind"] == "slow" and event["detected_after_s"] is not None and event["replan"], result.events
    assert all(e["kind"] == "slow" for e in result.events), result.events

    def work_of(plan: Plan, device: int) -> float:
        """The host profile's forward seconds a sync-round of the device's layers at its share of each micro-batch
        (the first conv is a fifth of the second; a re-plan may be hybrid or data-parallel, the slowed device
        taking fewer samples rather than fewer layers)."""
        stage = next(s for s in plan.stages if device in s.devices)
        share = stage.shares[stage.devices.index(device)]
        forward = profile.layer_times(share)[0][stage.layers[0] : stage.layers[1] + 1].sum()
        return float(forward) * plan.num_micro_batches

    assert 1 not in {d for s in final_plan.stages for d in s.devices} or \
        work_of(final_plan, 1) < work_of(THREE_STAGES, 1)
    assert not mine()


@needs_cgroups
@pytest.mark.timeout(600)  # calibrating a confined home beside the suite's other workers took over 240 s once
def test_two_sigterms_to_a_confined_home_train_still_remove_its_cgroups_and_workers(tmp_path):
    """A second signal while the first one's clean-up waits for the workers (a user pressing Ctrl-C twice)
    once left the cgroups behind."""
    command = [sys.executable, "-m", "ecofl.cli", "home", "train", "--model", "cnn", "--pool", "nano-10w,tx2-maxn",
               "--dataset", "digits", "--batch", "16", "--rounds", "100000", "--emulate", "cgroup",
               "--cache-dir", str(tmp_path)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 480

        def training() -> bool:  # its confined workers, each in its cgroup (after the devices timed the model in
            # their cgroups, and after a first run measured the runtime's overhead on three unconfined workers)
            workers = worker_processes(process.pid)
            return 0 < len(workers) == len([n for n in our_cgroups() if n.startswith(f"ecofl-{process.pid}-")])

        while not training() and time.time() < deadline and process.poll() is None:
            time.sleep(0.5)
        assert training(), f"never started (exit {process.poll()})"
        workers = worker_processes(process.pid)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # into the clean-up's grace for the workers
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert not [n for n in our_cgroups() if n.startswith(f"ecofl-{process.pid}-")]
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


@needs_cgroups
def test_a_calibration_file_gives_a_second_run_the_first_runs_plan_and_prediction(tmp_path):
    """--calibration FILE: the first run measures and writes, the second reuses (the same plan and predicted
    sync-round, no measuring), and a run with other settings is refused before it measures anything."""
    kept = tmp_path / "calibration.json"
    command = [sys.executable, "-m", "ecofl.cli", "home", "train", "--model", "cnn", "--pool",
               "nano-10w,tx2-maxq", "--dataset", "digits", "--batch", "32", "--rounds", "2",
               "--emulate", "cgroup", "--json", "--cache-dir", str(tmp_path), "--calibration", str(kept)]
    runs = []
    for _ in range(2):
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(json.loads(out.stdout))
        assert kept.exists()
    first, second = runs
    assert [s["layers"] for s in first["stages"]] == [s["layers"] for s in second["stages"]]
    assert [s["shares"] for s in first["stages"]] == [s["shares"] for s in second["stages"]]
    assert second["predicted_sync_round_s"] == first["predicted_sync_round_s"]
    assert [d["measured_speed"] for d in second["devices"]] == [d["measured_speed"] for d in first["devices"]]
    assert second["predicted_first_round_s"] == first["predicted_first_round_s"] > first["predicted_sync_round_s"]
    other = subprocess.run([*command[:command.index("--batch") + 1], "16", *command[command.index("--batch") + 2:]],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert other.returncode != 0 and "calibrated for other settings" in other.stderr and "batch 32" in other.stderr
    assert not left_behind()


def test_a_file_that_is_no_calibration_is_refused_with_its_name(tmp_path):
    from ecofl.cli.calibration_file import VERSION, load_calibration
    from ecofl.errors import UserError
    from ecofl.pools import load_pool

    garbage = tmp_path / "notes.json"
    garbage.write_text('{"version": 1, "speeds": "fast"}')
    with pytest.raises(UserError, match="notes.json is not a calibration file"):
        load_calibration(garbage, {}, load_pool("nano-10w,tx2-maxq"))
    edited = tmp_path / "edited.json"  # a calibration whose first-touch figure was edited into a word
    edited.write_text(json.dumps({"version": VERSION, "settings": {}, "measured_at": "now", "speeds": [0.1, 0.2],
                                  "measured": {"0": {"first_touch_s_per_byte": "fast"}},
                                  "plan": two_stages(0).to_dict()}))
    with pytest.raises(UserError, match="edited.json is not a calibration file.*first_touch_s_per_byte"):
        load_calibration(edited, {}, load_pool("nano-10w,tx2-maxq"))


def test_a_kept_calibration_gives_each_device_its_quota_as_cores_beside_its_measured_speed(tmp_path):
    """A run on a kept calibration predicts as the run that measured it: each device at its measured speed, and
    its messages at its quota's pace (the presets' speeds in cores, which it was confined to)."""
    from ecofl.cli.calibration_file import VERSION, load_calibration
    from ecofl.pools import load_pool

    presets = load_pool("nano-10w,tx2-maxq")
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"version": VERSION, "settings": {}, "measured_at": "now", "speeds": [0.05, 0.2],
                                "measured": {"0": {"first_touch_s_per_byte": 2e-9}}, "plan": two_stages(0).to_dict()}))
    confined, plan, _ = load_calibration(kept, {}, presets)
    assert [spec.speed for spec in confined.pool.devices] == [0.05, 0.2] and plan == two_stages(0)
    assert [spec.cores for spec in confined.pool.devices] == [spec.speed for spec in presets.devices]
    assert [spec.cpu_speed for spec in confined.pool.devices] == [limit.cores for limit in confined.limits.values()]


def test_identical_devices_share_one_measurement_and_others_keep_their_own():
    nano, tx2 = DeviceLimits(0.5, 1 << 30), DeviceLimits(1.0, 1 << 31)
    whole, stage = Work(4), Work(4, (0, 3))
    limits = {0: nano, 1: nano, 2: tx2, 3: nano}
    work = {0: whole, 1: whole, 2: whole, 3: stage}
    shared = shared_by_identical({0: 1.0, 1: 1.2, 2: 0.5, 3: 0.9}, limits, work)
    assert shared[0] == shared[1] == pytest.approx(1.1)  # the two nanos timing the whole model
    assert shared[2] == 0.5 and shared[3] == 0.9  # another kind of device; a nano timing other work
    # a byte mapped anew costs a kind of device the same on any work: the three nanos share what two measured
    touch = shared_by_kind({0: 2e-9, 1: None, 2: 5e-9, 3: 4e-9}, limits)
    assert touch[0] == touch[1] == touch[3] == pytest.approx(3e-9) and touch[2] == 5e-9
    assert shared_by_kind({0: None, 2: 5e-9}, limits) == {0: None, 2: 5e-9}


def test_a_plan_with_two_identical_devices_swapped_is_not_measured_again():
    """Two identical devices: planned on the whole model's speeds, device 0 gets the short stage; on their
    stages' speeds the planner swaps them. The swapped plan's work was measured already, by the twin: nothing
    is measured a third time, and each device takes its twin's speed and seconds per byte mapped on that work."""
    presets = HomePool("home", (DeviceSpec("nano", 1.0, GB, 1e9),) * 2)
    profile = synthetic_profile(4)
    nano = DeviceLimits(0.5, GB)  # confined to half a core: its cores are not its preset's speed
    swapped = Plan("two", (StagePlan((0, 0), (1,), (8,), 2), StagePlan((1, 3), (0,), (8,), 1)), 8, 4)
    measured: list[Workload] = []

    def measure(workload: Workload) -> ConfinedPool:
        measured.append(workload)
        speed = {None: 1.0, (0, 0): 0.5, (1, 3): 0.9}  # per sample: seconds of a stage's layers differ
        touch = {None: 1e-9, (0, 0): 2e-9, (1, 3): 3e-9}
        reports = {d: {"micro_batch": w.samples, "layers": w.layers, "measured_speed": speed[w.layers],
                       "first_touch_s_per_byte": touch[w.layers], "quota_cores": nano.cores} for d, w in workload}
        return ConfinedPool(measured_pool(presets, reports), {0: nano, 1: nano}, reports, workload)

    def plan_for(pool: HomePool) -> Plan:
        return two_stages(0) if pool.devices[0].speed == pool.devices[1].speed else swapped

    confined, plan = plan_on_measured_speeds(plan_for, profile, presets, measure)
    assert measured == [whole_model(range(2), 8), plan_workload(two_stages(0), range(2))]
    assert plan in (two_stages(0), swapped)
    speeds = {work: confined.pool.devices[d].speed for d, work in plan_workload(plan, range(2))}
    assert speeds == {Work(8, (0, 0)): 0.5, Work(8, (1, 3)): 0.9}  # each device at its stage's measured speed
    touch = {work: confined.pool.devices[d].first_touch_s_per_byte for d, work in plan_workload(plan, range(2))}
    assert touch == {Work(8, (0, 0)): 2e-9, Work(8, (1, 3)): 3e-9}
    assert [spec.cores for spec in confined.pool.devices] == [0.5, 0.5]  # the pace of their messages: the quota
