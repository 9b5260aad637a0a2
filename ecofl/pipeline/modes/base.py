"""What every pipeline mode answers (:mod:`ecofl.pipeline.modes`), with the answers most modes share.

The methods take a plan (:class:`ecofl.pipeline.plan.Plan`) or a worker's
role (:class:`ecofl.pipeline.runtime.topology.WorkerRole`) as plain data; the
runtime's parts (executors, drivers) are imported where they are used, so that
planning and the cost model never load the runtime.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ecofl.pipeline.instructions import Program
from ecofl.pipeline.schedule import Schedule, ScheduleKind

if TYPE_CHECKING:
    from ecofl.devices import HomePool
    from ecofl.pipeline.plan import Plan
    from ecofl.pipeline.profile import ModelProfile


class Mode:
    """A way to run a plan's stages. Subclasses set :attr:`kind` and override what differs."""

    kind: ClassVar[ScheduleKind]
    #: ``"training"`` (sync-rounds, or passes, of forwards and backwards) or ``"inference"`` (forward only)
    objective: ClassVar[str] = "training"
    #: the optimizer steps after every backward and no flush ends a sync-round (the cost model's step times)
    steps_after_every_backward: ClassVar[bool] = False
    #: device programs follow from each call's number of micro-batches, built by the worker (none in the role)
    programs_per_call: ClassVar[bool] = False
    #: a stage may be a data-parallel group of devices (Asteroid's hybrid stages)
    data_parallel_stages: ClassVar[bool] = True

    def __str__(self) -> str:
        return str(self.kind)

    # -- compatibility rules ------------------------------------------------------------

    def check(self, plan: Plan) -> None:
        """ValueError if ``plan``'s stages cannot run in this mode: a data-parallel stage where the mode has none
        (:attr:`data_parallel_stages`)."""
        if not self.data_parallel_stages and any(len(stage.devices) > 1 for stage in plan.stages):
            raise ValueError(f"{self.kind} runs one device per stage (no data-parallel stages)")

    def check_training(self, fault_tolerance: bool, tuning: bool = False) -> None:
        """ValueError if a training call cannot run in this mode with these settings."""

    # -- action lists and device programs -------------------------------------------------

    def actions(self, plan: Plan) -> Schedule:
        """The action lists of one sync-round of ``plan``, one per stage (:mod:`ecofl.pipeline.schedule`)."""
        raise ValueError(f"a '{self.kind}' plan is for {self.objective}: it has no sync-round "
                         "(ecofl.pipeline.stream.simulate_stream predicts it)")

    def validated_in_flight(self, plan: Plan) -> list[int] | None:
        """The in-flight bounds the action lists must keep (:func:`ecofl.pipeline.schedule.validate`), or None."""
        return None

    def stage_program(self, plan: Plan, schedule: Schedule | None, stage: int) -> tuple[Program, int]:
        """A stage's device program (empty: built per call) and the most forward tasks it keeps resident."""
        raise NotImplementedError

    def pass_program(self, role: Any, count: int) -> Program | None:
        """A call's program of ``count`` micro-batches for ``role`` where built per call (None: the role's)."""
        return None

    # -- cost and memory -----------------------------------------------------------------

    def resident_forwards(self, plan: Plan, stage: int) -> int:
        """Forward tasks ``stage`` holds at most (K_p of Asteroid eq. 3)."""
        raise NotImplementedError

    def version_window(self, num_stages: int, stage: int) -> int:
        """Weight versions a stage keeps for its forwards in flight and keeps again to average (0: one version,
        updated at the flush)."""
        return 0

    def rounds_per_pass(self, rounds: int) -> int:
        """Sync-rounds' micro-batches a call of ``rounds`` sync-rounds runs as one pass (1: a pass per round)."""
        return 1

    def seconds_per_sample(self, plan: Plan, profile: ModelProfile, pool: HomePool) -> float:
        """The cost model's time per sample: a sync-round over its mini-batch (Eco-FL eqs. 1-2)."""
        from ecofl.pipeline.cost import simulate

        return simulate(plan, profile, pool).sync_round_s / plan.batch_size

    # -- runtime -----------------------------------------------------------------------------

    def request_batch_size(self, plan: Plan) -> int:
        """The samples each update of a training request averages its loss over: the mini-batch."""
        return plan.batch_size

    def executor(self, role: Any, module: Any, mesh: Any, timeout_s: float) -> Any:
        """What runs ``role``'s share of the stage in a worker: a stage executor of forwards and backwards."""
        from ecofl.pipeline.runtime.stage import ShareExecutor

        return ShareExecutor(role, module, mesh, timeout_s)

    def train(self, pipeline: Any, start: dict, ref: dict, x: Any, y: Any, sync_rounds: int, optimization: Any,
              progress: Any, inject: Any) -> Any:
        """Drive the home's workers through a training call (the portal's driver); a PipelineResult."""
        raise NotImplementedError
