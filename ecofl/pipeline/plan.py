"""A pipeline plan as plain data: which devices run which layers, how.

Every planner (ecofl, hpp, pipeedge, even, dp) returns a :class:`Plan`; the
cost model simulates it, the runtime executes it, tests inspect it.
:func:`check_plan` fits a plan to a profile and a pool, :func:`sample_ranges`
says which samples each device of a stage computes, and :func:`plan_schedule`
gives the action lists a training plan runs (:mod:`ecofl.pipeline.schedule`).

A stage is a contiguous range of layers replicated over one or more devices
(Asteroid's hybrid pipeline parallelism: data parallel inside a stage,
pipeline across stages). Each micro-batch of ``micro_batch`` samples is split
over the stage's devices by ``shares`` (samples per device, summing to
``micro_batch``); a single-device stage has ``shares == (micro_batch,)``.
A data-parallel plan is one stage holding every device.

The ``schedule`` (a :class:`ScheduleKind`; a plan made with its string form
holds the member) says how the stages run and so what the plan is for:

- training (``"1f1b"``: 1F1B-Sync; ``"gpipe"``: backward after forward;
  ``"async-1f1b"``: asynchronous 1F1B): one sync-round is
  ``num_micro_batches`` micro-batches, weights update at the flush (or, in
  asynchronous 1F1B, after every backward); ``in_flight`` is K_p, the forward
  tasks a stage keeps for backward;
- inference (``"stream"``, PipeEdge): forward only, micro-batches stream
  through the stages with no flush; ``in_flight`` is the micro-batches a stage
  holds at once, from the start of receiving one until its output is sent on
  (:data:`STREAM_IN_FLIGHT` lets receiving, computing and sending overlap).
  ``num_micro_batches`` is the horizon the planner compared micro-batch sizes
  over (``batch_size`` samples); the runtime streams any number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ecofl.devices import HomePool
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.schedule import Schedule, ScheduleKind  # ScheduleKind: a plan's field, imported from here

if TYPE_CHECKING:  # a type hint only: a plan is plain data, and a worker need not load the profiler
    from ecofl.pipeline.profile import ModelProfile


#: Micro-batches a stage of a stream (inference) plan holds when memory allows:
#: one arriving, one in its forward, one being sent on, so that receiving,
#: computing and sending overlap (PipeEdge eq. 2's max(compute, comm)).
STREAM_IN_FLIGHT = 3


@dataclass(frozen=True)
class StagePlan:
    layers: tuple[int, int]  # first and last layer, inclusive
    devices: tuple[int, ...]  # indices into HomePool.devices
    shares: tuple[int, ...]  # samples of each micro-batch per device
    in_flight: int  # training: K_p forward tasks resident (Eco-FL eq. 3, Asteroid eq. 3); stream: micro-batches held

    def __post_init__(self) -> None:
        first, last = self.layers
        if not 0 <= first <= last:
            raise ValueError(f"bad layer range {self.layers}")
        if not self.devices or len(self.devices) != len(self.shares):
            raise ValueError(f"stage needs one share per device: {self.devices} vs {self.shares}")
        if any(s < 0 for s in self.shares) or sum(self.shares) == 0:
            raise ValueError(f"shares must be non-negative with a positive sum: {self.shares}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {self.in_flight}")


@dataclass(frozen=True)
class Plan:
    planner: str
    stages: tuple[StagePlan, ...]
    micro_batch: int  # samples per micro-batch
    num_micro_batches: int  # M per sync-round (mini-batch = micro_batch * M); stream: the planned horizon
    schedule: ScheduleKind = ScheduleKind.ONE_F_ONE_B  # or its string form, parsed here

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a plan needs at least one stage")
        for before, after in zip(self.stages, self.stages[1:]):
            if after.layers[0] != before.layers[1] + 1:
                raise ValueError(f"stages must cover consecutive layers: {before.layers} {after.layers}")
        if self.stages[0].layers[0] != 0:
            raise ValueError("the first stage must start at layer 0")
        for stage in self.stages:
            if sum(stage.shares) != self.micro_batch:
                raise ValueError(f"stage shares {stage.shares} do not sum to {self.micro_batch}")
        object.__setattr__(self, "schedule", ScheduleKind.from_str(self.schedule))
        mode_of(self).check(self)

    @property
    def objective(self) -> str:
        """``"inference"`` for a stream plan, else ``"training"``."""
        return mode_of(self).objective

    @property
    def batch_size(self) -> int:
        return self.micro_batch * self.num_micro_batches

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layers[1] + 1

    def to_dict(self) -> dict:
        return asdict(self)


def require_training(plan: Plan) -> None:
    """ValueError unless ``plan`` is a training plan (only those have a sync-round and a flush)."""
    if plan.objective != "training":
        raise ValueError(
            f"a '{plan.schedule}' plan is for {plan.objective}: it has no sync-round "
            "(ecofl.pipeline.stream.simulate_stream predicts it)"
        )


def plan_schedule(plan: Plan) -> Schedule:
    """The action lists a training plan runs (its mode's: :mod:`ecofl.pipeline.modes`)."""
    require_training(plan)
    return mode_of(plan).actions(plan)


def check_plan(plan: Plan, profile: ModelProfile, pool: HomePool) -> None:
    """ValueError unless the plan covers the profile's layers and uses each pool device in one stage at most."""
    if plan.num_layers != profile.num_layers:
        raise ValueError(f"plan covers {plan.num_layers} layers, profile {profile.model!r} has {profile.num_layers}")
    used = [d for stage in plan.stages for d in stage.devices]
    if len(set(used)) != len(used):
        raise ValueError(f"a device may serve one stage only: {used}")
    if any(not 0 <= d < len(pool) for d in used):
        raise ValueError(f"plan uses devices {used}, pool {pool.name!r} has {len(pool)}")


def sample_ranges(stage: StagePlan) -> list[tuple[int, int, int]]:
    """``(device, lo, hi)``: samples lo..hi-1 of each micro-batch, for each device of a stage with a share."""
    ranges, lo = [], 0
    for device, share in zip(stage.devices, stage.shares):
        if share:
            ranges.append((device, lo, lo + share))
        lo += share
    return ranges
