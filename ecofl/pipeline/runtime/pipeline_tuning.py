"""Re-planning on what the pipeline itself measured: a re-tune after the first sync-rounds, and every few after.

A confined device times its stage alone before planning
(:mod:`.calibration`); in the pipeline the same operations run in another
pattern (they wake when micro-batches arrive, stages contend for the host's
cores), and on this machine a device's compute there differed from its
calibration by up to a third (docs/pipeline.md, "Confined devices"). So a
plan balanced on the calibration is not balanced on the speeds the devices
really run at. FTPipeHD §III-D re-estimates each worker's capacity from the
layers it runs during training and re-partitions, after its first 10 batches
and then every 100; a :class:`Tuning` does that for every device, early, and
with ``every_rounds`` again every few sync-rounds, on the rounds since the
last (:class:`TuningWindow`), so that the plan and its prediction follow a
device whose speed drifts:

1. **Speeds from the pipeline.** Over the sync-rounds after the first
   (warm-up), each device's forward and backward seconds a round, less
   the memory it mapped anew in them (charged to a stage's first round
   apart, :mod:`ecofl.pipeline.first_touch`), are set
   against the cost model's for the same plan: its layers plus the runtime's
   per-operation and per-byte work, all at its speed (:mod:`.prediction`).
   C_d = measured / modelled and the device's speed becomes speed_d / C_d
   (FTPipeHD eqs. 1-3), so the model's passes for each device equal what it
   measured. A confined device is learned no faster than it calibrated:
   its short passes run on quota its CFS period refilled while it waited,
   a speed it does not keep on more work.
2. **Candidate plans.** The planner plans again at those speeds, once for
   every micro-batch size that fills a pipeline of two stages
   (:func:`ecofl.pipeline.planners.plans_by_micro_batch`; where devices
   compute at their own speeds, confined or a deployed home's, so do
   Asteroid's planner and plain data parallelism), and each candidate is
   predicted with the runtime's overheads (the planner's own search leaves
   them out).
3. **Decide.** Of the candidates, the one that finishes the rounds left
   first (:func:`.prediction.quickest_to_finish`, as a lightweight recovery
   chooses; a hybrid plan over the planner's own only where it finishes
   sooner by more than the hybrid margin, :func:`.prediction.preferred_to_finish`):
   what switching to it costs, its predicted migration (each device pair's
   layer bytes over its link) and the memory its devices map anew in its
   first round (:mod:`ecofl.pipeline.first_touch`), plus the rounds left at
   its sync-round. It replaces the current plan when, at the same speeds, it
   is predicted faster by more than ``margin`` (the model's own uncertainty)
   and the time it saves over the rounds left exceeds what switching costs.
   The fastest candidate is not always it: a plan at another micro-batch
   size maps its buffers anew, and with few rounds left one that maps less
   finishes first.

Everything here is plain data: :class:`TuningWindow` says when a re-tune is
due and which rounds it learns from, :func:`decide` takes what the workers
reported and returns a :class:`TuningDecision`; :mod:`.recovery` carries it
out between sync-rounds, with no replay.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ecofl.devices import DeviceSpec, HomePool
from ecofl.pipeline.cost import SyncRoundCost
from ecofl.pipeline.first_touch import estimated_first_round_extra_s
from ecofl.pipeline.migration import Holders, migration_s
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replan import full_replan, full_replans, with_speeds
from ecofl.pipeline.runtime.control_messages import Done
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.prediction import predict_sync_round, preferred_to_finish, weighs_hybrid
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.pipeline.schedule import PASSES, ActionKind


@dataclass(frozen=True)
class TuningDecision:
    """What a re-tune found and chose (seconds are predictions at the pipeline's speeds)."""

    after_round: int  # the last sync-round measured
    planned_speeds: dict[int, float]  # what the running plan was predicted at: the calibration's, or the last re-tune's
    speeds: dict[int, float]  # re-estimated from the pipeline's own operations
    current_s: float  # the current plan's sync-round
    best_s: float  # the fastest candidate's
    migration_s: float  # the fastest candidate's layer moves
    first_round_s: float  # the memory its first round maps anew (ecofl.pipeline.first_touch)
    rounds_left: int
    plan: Plan  # the plan to run from now on (the current one when not switched)
    switched: bool

    def to_dict(self) -> dict:
        stages = [{"layers": list(s.layers), "devices": list(s.devices), "shares": list(s.shares),
                   "in_flight": s.in_flight} for s in self.plan.stages]
        return {"after_round": self.after_round, "planned_speeds": _keyed(self.planned_speeds),
                "speeds": _keyed(self.speeds), "current_sync_round_s": self.current_s,
                "best_sync_round_s": self.best_s, "migration_s": self.migration_s, "first_round_s": self.first_round_s,
                "rounds_left": self.rounds_left,
                "switched": self.switched, "planner": self.plan.planner, "micro_batch": self.plan.micro_batch,
                "num_micro_batches": self.plan.num_micro_batches, "stages": stages}


@dataclass
class TuningWindow:
    """When a re-tune is due and which sync-rounds it learns from: the first after ``tuning.after_rounds`` rounds
    of the plan, then every ``tuning.every_rounds`` (none more where it is 0), each on the rounds since the last.
    A plan's first round (a new epoch's: a re-tune that switched, a recovery, a re-plan) warms up and maps its
    memory, so it is counted towards the period but never learned from."""

    tuning: Tuning
    retunes: int = 0  # re-tunes found due so far
    _epoch: int = -1  # the pipeline epoch of the rounds in the window
    _rounds: list[Mapping[int, Done] | None] = field(default_factory=list)  # None: a plan's first round

    def due(self, epoch: int, replies: Mapping[int, Done]) -> list[Mapping[int, Done]] | None:
        """Add a completed sync-round (run in pipeline ``epoch``, the workers' ``replies``); the rounds to
        re-tune on where a re-tune is due now (the window starts again), else None."""
        if self.retunes and not self.tuning.every_rounds:
            return None
        if epoch != self._epoch:
            self._epoch, self._rounds = epoch, [None]
        else:
            self._rounds.append(replies)
        period = self.tuning.every_rounds if self.retunes else self.tuning.after_rounds
        if len(self._rounds) < period:
            return None
        measured = [rounds for rounds in self._rounds if rounds is not None]
        self._rounds = []
        self.retunes += 1
        return measured


def decided_plan(decision: Mapping, schedule: str) -> Plan:
    """The plan a re-tune left running, from its record (:meth:`TuningDecision.to_dict`), in ``schedule``."""
    stages = tuple(StagePlan(tuple(s["layers"]), tuple(s["devices"]), tuple(s["shares"]), s["in_flight"])
                   for s in decision["stages"])
    return Plan(decision["planner"], stages, decision["micro_batch"], decision["num_micro_batches"], schedule)


def _keyed(speeds: Mapping[int, float]) -> dict[str, float]:
    return {str(d): float(v) for d, v in sorted(speeds.items())}


def measured_pass_s(rounds: Sequence[Mapping[int, Done]], pool: HomePool | None = None) -> dict[int, float]:
    """Each device's forward and backward seconds per sync-round, the mean over ``rounds`` (workers' replies).

    With a ``pool``, less the time a device spent mapping memory it touched for the first time in a round (its
    reported bytes at its calibrated ``first_touch_s_per_byte``): the cost model charges that mapping to a new
    stage's first round apart (:mod:`ecofl.pipeline.first_touch`), and a stage still maps some in its second
    and third (on the mixed home, 2026-12-03, up to 10.4 MiB on one device in round 1: 0.4 s at the Raspberry
    Pi's 38 ns a byte), which read as slowness would lower the device's speed for every round after."""
    totals: dict[int, float] = {}
    for replies in rounds:
        for device, reply in replies.items():
            seconds = sum(end - start for kind, _, start, end in reply.events if ActionKind.from_str(kind) in PASSES)
            spec = None if pool is None else pool.devices[device]
            totals[device] = totals.get(device, 0.0) + seconds - mapping_s(reply.first_touched_bytes, spec)
    return {d: total / len(rounds) for d, total in totals.items()}


def mapping_s(touched_bytes: int | None, spec: DeviceSpec | None) -> float:
    """The seconds a device spent mapping ``touched_bytes`` anew, at its calibrated seconds per byte (0: either
    not measured)."""
    per_byte = None if spec is None else spec.first_touch_s_per_byte
    return 0.0 if per_byte is None or not touched_bytes else touched_bytes * per_byte


def modelled_pass_s(cost: SyncRoundCost) -> dict[int, float]:
    """Each device's forward and backward seconds in the cost model's sync-round."""
    totals: dict[int, float] = {}
    for event in cost.timeline:
        if event.kind in PASSES:
            totals[event.device] = totals.get(event.device, 0.0) + event.end - event.start
    return totals


def pipeline_speeds(plan: Plan, profile: ModelProfile, pool: HomePool, emulation: Emulation,
                    measured: Mapping[int, float], cache_dir: str | None = None,
                    calibrated: HomePool | None = None) -> dict[int, float]:
    """Every device's speed with those that computed in ``plan`` re-estimated from ``measured`` (pass seconds a
    round): speed / C, C = measured / modelled (FTPipeHD eqs. 1-3, the model with the runtime's overheads).

    Where devices are confined and ``calibrated`` gives their calibration (a re-plan's speeds), a device is
    learned no faster than there, the speed it kept through back-to-back steps under its CPU quota. In the
    pipeline a device waits between passes, and a short pass runs on quota its CFS period refilled meanwhile:
    a speed it does not keep on more work. On the mixed home (2026-12-04 22:36) a Raspberry Pi computing one
    sample of eight read 2.7x its calibrated speed, and the re-tune that gave it a stage of its own predicted
    1.83 s a sync-round and measured 2.80 s; alone on the last stage (22:39) it read 1.8x."""
    modelled = modelled_pass_s(predict_sync_round(plan, profile, pool, emulation, cache_dir=cache_dir))
    speeds = {d: spec.speed for d, spec in enumerate(pool.devices)}
    ceiling = calibrated if emulation == Emulation.CGROUP else None
    for device, seconds in measured.items():
        if seconds > 0 and modelled.get(device, 0.0) > 0:
            learned = pool.devices[device].speed * modelled[device] / seconds
            speeds[device] = learned if ceiling is None else min(learned, ceiling.devices[device].speed)
    return speeds


def candidate_plans(tuning: Tuning, plan: Plan, profile: ModelProfile, pool: HomePool,
                    alive: Collection[int], hybrid: bool = False) -> list[Plan]:
    """The planner's plans at ``pool``'s speeds for each micro-batch size the runtime weighs (or the one fixed), on
    the ``alive`` devices, in the current plan's schedule; with ``hybrid``, its hybrid plans too
    (:func:`~ecofl.pipeline.replan.full_replans`)."""
    planner = tuning.planner or plan.planner
    plans = ([full_replan(planner, profile, pool, alive, plan.batch_size, micro_batch=tuning.micro_batch)]
             if tuning.micro_batch else full_replans(planner, profile, pool, alive, plan.batch_size, hybrid=hybrid))
    return [dataclasses.replace(new, schedule=plan.schedule) for new in plans]


def decide(tuning: Tuning, plan: Plan, profile: ModelProfile, pool: HomePool, emulation: Emulation,
           rounds: Sequence[Mapping[int, Done]], after_round: int, holders: Holders, alive: Collection[int],
           rounds_left: int, cache_dir: str | None = None, calibrated: HomePool | None = None) -> TuningDecision:
    """Re-estimate the speeds from ``rounds`` (the workers' replies of the measured ones, warm-up excluded;
    the last is sync-round ``after_round``), re-plan, and choose (see the module docstring). ``pool`` carries
    the speeds ``plan`` was made on; ``holders``: who holds each layer; ``calibrated``: the devices' calibrated
    speeds, which a confined device is not learned above (:func:`pipeline_speeds`)."""
    speeds = pipeline_speeds(plan, profile, pool, emulation, measured_pass_s(rounds, pool), cache_dir, calibrated)
    tuned = with_speeds(pool, speeds)
    current_s = predict_sync_round(plan, profile, tuned, emulation, cache_dir=cache_dir).sync_round_s
    candidates = [c for c in candidate_plans(tuning, plan, profile, tuned, alive, weighs_hybrid(plan, emulation))
                  if c != plan]
    best, best_s = plan, current_s
    if candidates:
        best, _ = preferred_to_finish(candidates, tuning.planner or plan.planner, plan, holders, rounds_left,
                                      profile, tuned, emulation, cache_dir)
        best_s = predict_sync_round(best, profile, tuned, emulation, cache_dir=cache_dir).sync_round_s
    moving_s = migration_s(best, holders, profile, tuned) if best is not plan else 0.0
    first_round_s = estimated_first_round_extra_s(best, profile, tuned, plan) if best is not plan else 0.0
    pays = (current_s - best_s) * rounds_left > moving_s + first_round_s
    switched = best_s < (1 - tuning.margin) * current_s and pays
    return TuningDecision(after_round=after_round, planned_speeds={d: s.speed for d, s in enumerate(pool.devices)},
                          speeds=speeds, current_s=current_s, best_s=best_s, migration_s=moving_s,
                          first_round_s=first_round_s, rounds_left=rounds_left, plan=best if switched else plan,
                          switched=switched)
