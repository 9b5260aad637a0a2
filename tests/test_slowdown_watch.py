"""Eco-FL §4.4's slow-down watch on made-up worker replies: what it expects of a device is the cost model's
pass, the runtime's overhead per operation included, as confined speeds are measured."""

from __future__ import annotations

import json

from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.runtime.control_messages import Done
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.host_overhead import record_path
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.slowdown_watch import SlowdownWatch
from pipeline_kit import PROFILE, THREE_STAGES, WITHOUT_BATCH_NORM, pool


def replies(layout: PipelineLayout, per_micro_batch_s: dict[int, float]) -> dict[int, Done]:
    """A round in which device d's forward and backward of each micro-batch took ``per_micro_batch_s[d]``."""
    out = {}
    for role in layout.roles:
        half = per_micro_batch_s[role.device] / 2
        events = [(kind, m, 0.0, half) for m in range(layout.plan.num_micro_batches) for kind in ("F", "B")]
        out[role.device] = Done(events, 0.0, 0, 0, 0, None, None, [])
    return out


def test_a_device_computing_as_modelled_after_one_fast_round_is_not_found_slow(tmp_path):
    """Each operation's overhead is three times the last stage's layers. The device runs one round at half its
    modelled pass (a burst), then as modelled: its best pace is then half the model's. Against its layers alone
    the watch would find it slow (the modelled pass is 4x the layers, over 1.5x its best pace); against the
    model's pass, overhead included, it is not. Slowed to twice the model's pass, it is found slow."""
    model, layers = WITHOUT_BATCH_NORM.build()
    home = pool(3)
    layout = PipelineLayout(model, layers, home, THREE_STAGES, PROFILE, sleeps=False, pace_links=False)
    last = next(role for role in layout.roles if role.device == 2)
    layers_s = sum(stage_compute_s(PROFILE, home.devices[2], last.layers, last.samples))
    overhead_s = 3 * layers_s / 2  # per forward and per backward
    record_path(str(tmp_path)).write_text(json.dumps({"operation_overhead_s": overhead_s, "byte_overhead_s": 0.0}))
    modelled = {role.device: sum(stage_compute_s(PROFILE, home.devices[role.device], role.layers, role.samples))
                + 2 * overhead_s for role in layout.roles}
    watch = SlowdownWatch(FaultTolerance(), Emulation.CGROUP, str(tmp_path))
    speeds = {d: spec.speed for d, spec in enumerate(home.devices)}
    burst = {d: 0.5 * s for d, s in modelled.items()}
    found = [watch.slow_devices(layout, speeds, replies(layout, r), 0) for r in (burst, modelled, modelled, modelled)]
    assert found == [[], [], [], []]
    assert modelled[2] > 1.5 * max(layers_s, burst[2])  # what the layers-only expectation would have flagged
    slowed = {**modelled, 2: 2 * modelled[2]}
    assert [watch.slow_devices(layout, speeds, replies(layout, slowed), 0) for _ in range(2)] == [[], [2]]
