"""PipeDream's asynchronous 1F1B as FTPipeHD runs it (§III-C).

Stage s keeps S - s forwards in flight and steps its optimizer after every
backward: there is no flush, a call's ``rounds`` x M micro-batches run as one
pass, each its own update (its loss over one micro-batch), on the weights its
forward used (weight stashing), and each stage averages its last S - s weight
versions every ``aggregate_every`` x (S - s) updates. One device per stage,
and no replay: there are no sync-rounds to replay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ecofl.pipeline.instructions import Program, async_program, check_program
from ecofl.pipeline.modes.base import Mode
from ecofl.pipeline.schedule import Schedule, ScheduleKind, async_one_f_one_b

if TYPE_CHECKING:
    from ecofl.pipeline.plan import Plan


class AsyncOneFOneB(Mode):
    kind = ScheduleKind.ASYNC_ONE_F_ONE_B
    steps_after_every_backward = True
    programs_per_call = True
    data_parallel_stages = False

    def check_training(self, fault_tolerance: bool, tuning: bool = False) -> None:
        if fault_tolerance:
            raise ValueError("asynchronous 1F1B has no sync-rounds to replay: run it without fault tolerance")
        if tuning:
            raise ValueError("asynchronous 1F1B runs one pass, with no sync-rounds to re-tune between: run it "
                             "without tuning")

    def actions(self, plan: Plan) -> Schedule:
        return async_one_f_one_b(len(plan.stages), plan.num_micro_batches)

    def stage_program(self, plan: Plan, schedule: Schedule | None, stage: int) -> tuple[Program, int]:
        return (), len(plan.stages) - stage

    def pass_program(self, role: Any, count: int) -> Program:
        """The pass's program for ``count`` micro-batches, built and checked in the worker."""
        actions = async_one_f_one_b(role.num_stages, count)[role.stage]
        program = async_program(actions, role.stage, role.num_stages, role.aggregate_every)
        check_program(program, role.stage, role.num_stages, replicated=False, asynchronous=True)
        return program

    def resident_forwards(self, plan: Plan, stage: int) -> int:
        """min(S - s, M)."""
        return min(len(plan.stages) - stage, plan.num_micro_batches)

    def version_window(self, num_stages: int, stage: int) -> int:
        """S - s: its forwards in flight each keep the version they used (weight stashing), and its last S - s
        versions are averaged (FTPipeHD's aggregation)."""
        return num_stages - stage

    def rounds_per_pass(self, rounds: int) -> int:
        return rounds

    def request_batch_size(self, plan: Plan) -> int:
        """Every micro-batch is its own update."""
        return plan.micro_batch

    def train(self, pipeline: Any, start: dict, ref: dict, x: Any, y: Any, sync_rounds: int, optimization: Any,
              progress: Any, inject: Any) -> Any:
        """The call's sync_rounds x M micro-batches as one pass."""
        from ecofl.pipeline.runtime.sync_training import train_async

        return train_async(pipeline.control, pipeline.layout, start, ref, x, y, sync_rounds, optimization)
