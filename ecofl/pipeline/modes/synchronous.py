"""Synchronous training modes: a sync-round of M micro-batches ends at a flush, where every device's
accumulated gradients update its weights once (Eco-FL §4.3). 1F1B-Sync and GPipe differ only in the order of
passes; everything else is this module's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecofl.pipeline.instructions import Backward, Forward, Program, device_program
from ecofl.pipeline.modes.base import Mode
from ecofl.pipeline.schedule import Schedule

if TYPE_CHECKING:
    from ecofl.pipeline.plan import Plan


class SynchronousMode(Mode):
    """A synchronous training mode: programs from the plan's action lists, a flush per sync-round, replay."""

    def stage_program(self, plan: Plan, schedule: Schedule | None, stage: int) -> tuple[Program, int]:
        actions = (self.actions(plan) if schedule is None else schedule)[stage]
        program = device_program(actions, stage, len(plan.stages), replicated=len(plan.stages[stage].devices) > 1)
        return program, resident_bound(program)

    def train(self, pipeline: Any, start: dict, ref: dict, x: Any, y: Any, sync_rounds: int, optimization: Any,
              progress: Any, inject: Any) -> Any:
        """Sync-round after sync-round, replayed on failure with fault tolerance on."""
        from ecofl.pipeline.runtime.sync_training import train_sync_rounds

        return train_sync_rounds(pipeline.control, pipeline.layout, pipeline.fault_tolerance,
                                 pipeline.worker_config, start, ref, x, y, sync_rounds, optimization, progress,
                                 inject, tuning=pipeline.tuning, emulation=pipeline.emulation,
                                 cache_dir=pipeline.cache_dir)


def resident_bound(program: Program) -> int:
    """The most forward tasks a device program keeps resident (forwards not yet matched by their backward)."""
    resident = most = 0
    for instruction in program:
        resident += {Forward: 1, Backward: -1}.get(type(instruction), 0)
        most = max(most, resident)
    return most
