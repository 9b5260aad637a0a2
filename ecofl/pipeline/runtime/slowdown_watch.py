"""Eco-FL §4.4's monitor of device speeds: a device whose compute time per micro-batch stays above what is
expected of it for ``slowdown_rounds`` sync-rounds is slow, and its speed is re-estimated (FTPipeHD eqs. 1-3)."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.runtime.control_messages import Done
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.host_overhead import runtime_overheads
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.schedule import PASSES, ActionKind


class SlowdownWatch:
    """Each device's pace in the current plan and how many sync-rounds in a row it has been slow (its devices
    run in ``emulation``, whose runtime overhead per operation the model's pass counts: this host's, read once
    from ``cache_dir``)."""

    def __init__(self, ft: FaultTolerance, emulation: Emulation = Emulation.NONE, cache_dir: str | None = None):
        self.ft, self.emulation, self.cache_dir = ft, emulation, cache_dir
        self._slow: dict[int, int] = {}
        self._pace: dict[int, float] = {}  # each device's best seconds per micro-batch in the current plan
        self._pace_epoch = 0

    def slow_devices(self, layout: PipelineLayout, speeds: dict[int, float], replies: dict[int, Done],
                     epoch: int) -> list[int]:
        """The devices slow for long enough after a sync-round's ``replies`` (then the count starts afresh).

        A device deviates when its seconds per micro-batch exceed ``slowdown_ratio`` times the larger of the
        cost model's and its own best pace in the current plan (``epoch``): the model alone would flag a
        device the model underestimates (a confined device's measured speed a little off, a loaded host) as
        slow from its first round. The model's pass is its layers and the runtime's overhead per forward and
        backward, at the device's speed, as the speeds are measured (:func:`.calibration.speed_from_step`)."""
        if self._pace_epoch != epoch:
            self._pace, self._pace_epoch = {}, epoch
        pool = with_speeds(layout.pool, speeds)
        slow = []
        for role in layout.roles:
            times = [end - start for kind, _, start, end in replies[role.device].events
                     if ActionKind.from_str(kind) in PASSES]
            if not times or role.samples == 0:
                continue
            per_micro_batch = 2 * float(np.mean(times))  # one forward and one backward
            expected = sum(stage_compute_s(layout.profile, pool.devices[role.device], role.layers, role.samples,
                                           self.operation_overhead_s))
            pace = self._pace[role.device] = min(self._pace.get(role.device, per_micro_batch), per_micro_batch)
            if per_micro_batch > self.ft.slowdown_ratio * max(expected, pace):
                self._slow[role.device] = self._slow.get(role.device, 0) + 1
                if self._slow[role.device] >= self.ft.slowdown_rounds:
                    slow.append(role.device)
            else:
                self._slow.pop(role.device, None)
        if slow:
            self._slow.clear()
        return slow

    @cached_property
    def operation_overhead_s(self) -> float:
        """The runtime's seconds per forward or backward on this host in the watched emulation (0: sleeping)."""
        return runtime_overheads(self.emulation, self.cache_dir).get("operation_overhead_s", 0.0)
