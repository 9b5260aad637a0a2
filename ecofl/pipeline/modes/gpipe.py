"""GPipe's backward after forward (BAF-Sync): every forward of a sync-round, then every backward; the memory
baseline, as it keeps all M micro-batches' activations."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ecofl.pipeline.modes.synchronous import SynchronousMode
from ecofl.pipeline.schedule import Schedule, ScheduleKind, gpipe

if TYPE_CHECKING:
    from ecofl.pipeline.plan import Plan


class GPipe(SynchronousMode):
    kind = ScheduleKind.GPIPE

    def actions(self, plan: Plan) -> Schedule:
        return gpipe(len(plan.stages), plan.num_micro_batches)

    def resident_forwards(self, plan: Plan, stage: int) -> int:
        """M: every micro-batch's forward before the first backward."""
        return plan.num_micro_batches
