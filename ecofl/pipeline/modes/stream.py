"""Pipelined inference (PipeEdge): forward only, micro-batches stream through the stages with no flush, each
stage holding ``in_flight`` of them (:data:`ecofl.pipeline.plan.STREAM_IN_FLIGHT`); its cost model is
:mod:`ecofl.pipeline.stream`, its driver :mod:`ecofl.pipeline.runtime.pipelined_inference`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecofl.pipeline.instructions import Program
from ecofl.pipeline.modes.base import Mode
from ecofl.pipeline.schedule import Schedule, ScheduleKind

if TYPE_CHECKING:
    from ecofl.devices import HomePool
    from ecofl.pipeline.plan import Plan
    from ecofl.pipeline.profile import ModelProfile


class Stream(Mode):
    kind = ScheduleKind.STREAM
    objective = "inference"
    programs_per_call = True

    def stage_program(self, plan: Plan, schedule: Schedule | None, stage: int) -> tuple[Program, int]:
        return (), plan.stages[stage].in_flight

    def seconds_per_sample(self, plan: Plan, profile: ModelProfile, pool: HomePool) -> float:
        """The stream's inverse throughput (PipeEdge §III-B)."""
        from ecofl.pipeline.stream import simulate_stream

        return 1.0 / simulate_stream(plan, profile, pool).throughput

    def executor(self, role: Any, module: Any, mesh: Any, timeout_s: float) -> Any:
        """A stream executor: forwards as micro-batches arrive, back-pressured."""
        from ecofl.pipeline.runtime.stream_stage import StreamExecutor

        return StreamExecutor(role, module, mesh, timeout_s)
