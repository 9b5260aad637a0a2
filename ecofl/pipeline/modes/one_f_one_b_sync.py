"""1F1B-Sync (Eco-FL §4.3, Fig. 3/4; Asteroid Fig. 4b): stage s keeps K_s forward tasks in flight, then
alternates one backward and one forward, and its weights update once at the flush."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ecofl.pipeline.modes.synchronous import SynchronousMode
from ecofl.pipeline.schedule import Schedule, ScheduleKind, one_f_one_b, warmup_forwards

if TYPE_CHECKING:
    from ecofl.pipeline.plan import Plan


class OneFOneBSync(SynchronousMode):
    kind = ScheduleKind.ONE_F_ONE_B

    def actions(self, plan: Plan) -> Schedule:
        return one_f_one_b(len(plan.stages), plan.num_micro_batches, self.validated_in_flight(plan))

    def validated_in_flight(self, plan: Plan) -> list[int]:
        """Each stage's K_s: the schedule must never hold more forward tasks on a stage."""
        return [stage.in_flight for stage in plan.stages]

    def resident_forwards(self, plan: Plan, stage: int) -> int:
        """min(K_0..K_s, M) (:func:`ecofl.pipeline.schedule.warmup_forwards`)."""
        return warmup_forwards(self.validated_in_flight(plan), stage, plan.num_micro_batches)
