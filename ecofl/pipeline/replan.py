"""Re-planning a home pipeline whose devices slowed down, left or failed, as plain data.

Three ways, as the papers compare them:

- **lightweight** (Asteroid §3.4, "Layer-wise Lightweight Pipeline
  Re-planning"): keep the stages and their order, drop the devices that are
  gone, and move the partition points so that every stage's share of the
  model's FLOPs is proportional to its computing capacity sum_{d in G_s} v_d.
  No search: one pass over the FLOPs prefix sums. :func:`lightweight_replans`
  gives the same partition at each micro-batch size, for a runtime that
  picks the one it predicts fastest: the size moves no state, and a plan of
  fewer stages may want larger micro-batches (beyond Asteroid, which keeps
  the size).
- **full** (Eco-FL §4.4; FTPipeHD §III-D's re-partition): run the planner
  again on the surviving devices with their re-measured speeds (it may change
  the device order and the number of stages).
- **heavy** (Asteroid's "heavy rescheduling" baseline): the same plan as
  full, but every stage's weights are gathered at the portal and sent out
  again (:func:`ecofl.pipeline.migration.heavy_moves`), instead of moving only
  the layers that change owner.

Device speeds come from measurement, FTPipeHD §III-D eqs. 1-3: the capacity
of a worker is the ratio of its measured execution time to the reference
time of the same work (here the cost model's passes for the device at its
planned speed, the runtime's overheads included:
:func:`ecofl.pipeline.runtime.pipeline_tuning.pipeline_speeds`),
C = T_measured / T_predicted, and its new speed is speed / C (eq. 3 scales
every layer's time by C); :func:`with_speeds` puts them into a pool.

Every plan returned keeps device indices of the *original* pool, so the
runtime can keep talking to the same workers; devices that are gone are in
no stage.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from ecofl import names
from ecofl.devices import DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.pipeline.memory_model import stage_memory_bytes
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners import make_plan, plans_by_micro_batch
from ecofl.pipeline.planners.memory import micro_batch_candidates
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replication import backup_bytes
from ecofl.pipeline.schedule import target_in_flight

REPLAN_KINDS = names.REPLAN_KINDS


def with_speeds(pool: HomePool, speeds: Mapping[int, float],
                first_touch_s_per_byte: Mapping[int, float | None] | None = None,
                cores: Mapping[int, float] | None = None) -> HomePool:
    """``pool`` with device d's speed replaced by ``speeds[d]`` and, where d is a key of
    ``first_touch_s_per_byte``, its seconds per byte mapped anew by that value (None: not measured), where a
    key of ``cores``, its cores (a confined device's quota). A device with cores, given a new speed and no
    cores, keeps them in proportion to its speed: a load spike that slows its passes (a re-estimate from the
    pipeline's rounds) cuts the CPU its messages run on as well. Links unchanged."""
    touch = {} if first_touch_s_per_byte is None else first_touch_s_per_byte
    quota = {} if cores is None else cores

    def cores_of(d: int, spec: DeviceSpec) -> float | None:
        if d in quota or spec.cores is None or d not in speeds:
            return quota.get(d, spec.cores)
        return spec.cores * float(speeds[d]) / spec.speed

    devices = tuple(replace(spec, speed=float(speeds.get(d, spec.speed)),
                            first_touch_s_per_byte=touch.get(d, spec.first_touch_s_per_byte), cores=cores_of(d, spec))
                    for d, spec in enumerate(pool.devices))
    return HomePool(name=pool.name, devices=devices, bandwidth_bps=_finite(pool.bandwidth_bps))


def surviving_pool(pool: HomePool, alive: Collection[int]) -> tuple[HomePool, tuple[int, ...]]:
    """The pool of the ``alive`` devices (in pool order) and, per new index, the original index."""
    kept = tuple(sorted(set(alive)))
    if not kept:
        raise UserError(f"home pool {pool.name!r}: no device is left to train on")
    bandwidth = _finite(pool.bandwidth_bps)[np.ix_(kept, kept)]
    devices = tuple(pool.devices[d] for d in kept)
    return HomePool(name=pool.name, devices=devices, bandwidth_bps=bandwidth), kept


def lightweight_replan(
    plan: Plan, profile: ModelProfile, pool: HomePool, lost: Collection[int] = (),
    speeds: Mapping[int, float] | None = None, micro_batch: int | None = None,
) -> Plan:
    """Asteroid §3.4: drop ``lost`` devices, re-cut the layers by FLOPs in proportion to stage capacity.

    A replicated stage that loses devices keeps its survivors (samples re-split
    by speed); a stage that loses all of them disappears and its layers go to
    its neighbours through the new cut points. K_s is re-derived for the new
    number of stages (P_s = 2(S-s)-1, capped by memory and M). ``micro_batch``
    (a divisor of the mini-batch) replaces the plan's. Raises
    :class:`UserError` when the shifted plan does not fit a device's memory
    (the caller then re-plans fully).
    """
    speeds = {d: spec.speed for d, spec in enumerate(pool.devices)} | dict(speeds or {})
    micro_batch = micro_batch or plan.micro_batch
    if plan.batch_size % micro_batch:
        raise ValueError(f"micro-batch {micro_batch} does not divide the mini-batch {plan.batch_size}")
    lost = set(lost)
    groups = [tuple(d for d in stage.devices if d not in lost) for stage in plan.stages]
    groups = [g for g in groups if g]
    if not groups:
        raise UserError("every device of the pipeline is lost: nothing to re-plan on")
    if len(groups) > plan.num_layers:
        raise UserError(f"{len(groups)} stages cannot share {plan.num_layers} layers")
    capacity = np.array([sum(speeds[d] for d in g) for g in groups], dtype=float)
    cuts = _proportional_cuts(profile.flops[: plan.num_layers], capacity)
    bounds = list(zip([0, *cuts], [c - 1 for c in cuts] + [plan.num_layers - 1]))
    stages = [
        StagePlan(layers=(lo, hi), devices=g, shares=_split(micro_batch, [speeds[d] for d in g]), in_flight=1)
        for g, (lo, hi) in zip(groups, bounds)
    ]
    shifted = replace(plan, stages=tuple(stages), micro_batch=micro_batch,
                      num_micro_batches=plan.batch_size // micro_batch)
    return _with_in_flight(shifted, profile, pool)


def lightweight_replans(
    plan: Plan, profile: ModelProfile, pool: HomePool, lost: Collection[int] = (),
    speeds: Mapping[int, float] | None = None,
) -> list[Plan]:
    """:func:`lightweight_replan` at each micro-batch size a planner may choose for the survivors
    (:func:`~ecofl.pipeline.planners.memory.micro_batch_candidates`), the plan's own first; a size the devices'
    memory refuses is left out (if every size is, the refusal of the plan's own is raised)."""
    survivors = len({d for stage in plan.stages for d in stage.devices} - set(lost))
    sizes = [plan.micro_batch] + [m for m in micro_batch_candidates(plan.batch_size, survivors)
                                  if m != plan.micro_batch]
    plans, refused = [], None
    for size in sizes:
        try:
            plans.append(lightweight_replan(plan, profile, pool, lost, speeds, size))
        except UserError as error:
            refused = refused or error
    if not plans:
        raise refused
    return plans


def full_replan(
    planner: str, profile: ModelProfile, pool: HomePool, alive: Collection[int], batch_size: int,
    speeds: Mapping[int, float] | None = None, **options: object,
) -> Plan:
    """Run ``planner`` again on the ``alive`` devices at their current ``speeds`` (Eco-FL §4.4).

    The plan's device indices are mapped back to the original pool.
    """
    survivors, original = surviving_pool(with_speeds(pool, speeds or {}), alive)
    return _in_pool_indices(make_plan(planner, profile, survivors, batch_size, **options), original)


#: The planners whose hybrid plans a planner's are weighed beside where the runtime's cost model chooses
#: (``hybrid`` of :func:`full_replans`). Eco-FL's planner gives each stage one device (§4.2, eq. 1); Asteroid's
#: gives a stage a data-parallel group of devices where that balances the stages better (HPP, §3.3), by its own
#: objective (Asteroid eqs. 4-8), which leaves out the runtime's work per operation. Plain data parallelism is
#: the one-stage point of the same space (at the largest micro-batch its devices hold,
#: :func:`~ecofl.pipeline.planners.plans_by_micro_batch`): a home of identical devices on fast links can train
#: fastest so (Asteroid Table 4's Env A of five Nanos, confined: HPP's plan at 0.86-0.88 of DP's throughput,
#: 0.93 predicted; docs/RESULTS.md).
HYBRID_PLANNERS: dict[str, tuple[str, ...]] = {"ecofl": ("hpp", "dp")}


def full_replans(planner: str, profile: ModelProfile, pool: HomePool, alive: Collection[int], batch_size: int,
                 speeds: Mapping[int, float] | None = None, hybrid: bool = False, **options: object) -> list[Plan]:
    """:func:`full_replan` at each micro-batch size the runtime weighs (:func:`plans_by_micro_batch`), for a
    caller that compares them with costs the planner leaves out; with ``hybrid`` (and no ``options``), the plans
    of its :data:`HYBRID_PLANNERS` too (the planner's own refusal is raised only where none of them plans)."""
    survivors, original = surviving_pool(with_speeds(pool, speeds or {}), alive)
    planners = [planner, *(HYBRID_PLANNERS.get(planner, ()) if hybrid and not options else ())]
    plans, refusal = [], None
    for name in planners:
        try:
            plans += plans_by_micro_batch(name, profile, survivors, batch_size, **options)
        except UserError as error:  # e.g. Eco-FL's planner on fewer layers than devices, or memory
            refusal = refusal or error
    if not plans:
        raise refusal
    return [_in_pool_indices(plan, original) for plan in plans]


#: Most cut-point vectors :func:`shifted_replans` returns (the cost model predicts each during a recovery).
MAX_SHIFTED_PLANS = 250


def shifted_replans(plan: Plan, profile: ModelProfile, pool: HomePool, window: int = 3) -> list[Plan]:
    """``plan`` with its cut points moved, each by at most ``window`` layers (fewer where the vectors would
    number more than :data:`MAX_SHIFTED_PLANS`): the same stages, devices, shares and micro-batch, every stage
    keeping a layer; plans that do not fit memory are left out.

    A lightweight re-plan's cut points are in proportion to FLOPs (Asteroid §3.4), which is neither what
    the cost model predicts fastest (it counts activations on the links and the runtime's work) nor what
    moves the fewest bytes from where the survivors hold their layers: its neighbours are the candidates
    a recovery weighs the two with (:func:`ecofl.pipeline.runtime.prediction.quickest_to_finish`)."""
    cuts = [stage.layers[0] for stage in plan.stages[1:]]
    while window > 0 and (2 * window + 1) ** len(cuts) > MAX_SHIFTED_PLANS:
        window -= 1
    plans = []
    for shift in itertools.product(range(-window, window + 1), repeat=len(cuts)):
        if not any(shift):
            continue
        moved = [c + d for c, d in zip(cuts, shift)]
        firsts, lasts = [0, *moved], [c - 1 for c in moved] + [plan.num_layers - 1]
        if any(last < first for first, last in zip(firsts, lasts)):
            continue
        stages = tuple(replace(stage, layers=(first, last))
                       for stage, first, last in zip(plan.stages, firsts, lasts))
        try:
            plans.append(_with_in_flight(replace(plan, stages=stages), profile, pool))
        except UserError:
            continue  # a stage that no longer fits its device
    return plans


def _in_pool_indices(plan: Plan, original: Sequence[int]) -> Plan:
    """``plan`` (made on a surviving pool) with its devices numbered as in the original pool."""
    return replace(plan, stages=tuple(replace(s, devices=tuple(original[d] for d in s.devices)) for s in plan.stages))


def _proportional_cuts(flops: np.ndarray, capacity: np.ndarray) -> list[int]:
    """First layer of stages 1..S-1 so that stage s's FLOPs share is closest to capacity_s / sum.

    Every stage keeps at least one layer; a cut is the layer boundary whose
    FLOPs prefix is nearest the stage's target prefix.
    """
    work = np.maximum(np.asarray(flops, dtype=float), 0.0)
    if work.sum() <= 0:
        work = np.ones_like(work)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    targets = np.cumsum(capacity)[:-1] / capacity.sum() * prefix[-1]
    num_layers, num_stages = len(work), len(capacity)
    cuts: list[int] = []
    for s, target in enumerate(targets, start=1):
        low = (cuts[-1] if cuts else 0) + 1  # the previous stage keeps at least one layer
        high = num_layers - (num_stages - s)  # the following stages keep at least one each
        candidates = np.arange(low, high + 1)
        cuts.append(int(candidates[np.argmin(np.abs(prefix[candidates] - target))]))
    return cuts


def _split(micro_batch: int, speeds: Sequence[float]) -> tuple[int, ...]:
    """``micro_batch`` samples over devices in proportion to speed (largest remainders)."""
    weights = np.asarray(speeds, dtype=float) / float(np.sum(speeds))
    raw = weights * micro_batch
    shares = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - shares), kind="stable")[: micro_batch - int(shares.sum())]:
        shares[i] += 1
    return tuple(int(s) for s in shares)


def _with_in_flight(plan: Plan, profile: ModelProfile, pool: HomePool) -> Plan:
    """K_s = min(P_s, Q_s, M) for every stage, Q_s counting the backups a device holds
    (:func:`ecofl.pipeline.replication.backup_bytes`); a UserError when a stage fits no forward task.

    Memory grows with K_s and the resident forwards of stage s are
    min(K_0..K_s, M) <= K_s, so a stage that fits K_s fits what it holds.
    """
    num_stages = len(plan.stages)
    reserved = backup_bytes(plan, profile)
    stages = []
    for s, stage in enumerate(plan.stages):
        target = min(target_in_flight(num_stages, s), plan.num_micro_batches)
        fitting = [k for k in range(target, 0, -1) if _fits(profile, pool, stage, k, reserved)]
        if not fitting:
            tightest = min(stage.devices, key=lambda d: pool.devices[d].memory_bytes)
            raise UserError(
                f"re-planned stage {s} (layers {stage.layers[0]}-{stage.layers[1]}) does not fit device "
                f"{tightest} ({pool.devices[tightest].name}) even with one forward task in flight"
            )
        stages.append(replace(stage, in_flight=fitting[0]))
    return replace(plan, stages=tuple(stages))


def _fits(profile: ModelProfile, pool: HomePool, stage: StagePlan, resident: int, reserved: Mapping[int, int]) -> bool:
    return all(
        stage_memory_bytes(profile, stage.layers, share, resident) + reserved.get(d, 0) <= pool.devices[d].memory_bytes
        for d, share in zip(stage.devices, stage.shares) if share > 0
    )


def _finite(matrix: np.ndarray) -> np.ndarray:
    """A pool's bandwidth matrix with the diagonal (inf, a device to itself) made finite for re-use."""
    out = np.array(matrix, dtype=float)
    np.fill_diagonal(out, 1.0)
    return out
