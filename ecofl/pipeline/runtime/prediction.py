"""The cost model's sync-round for a pipeline as it will really run, in each emulation mode.

Sleeping devices follow the cost model by construction (Eco-FL §4.2's
sync-round, eq. 1-2, simulated event by event: :func:`ecofl.pipeline.cost.simulate`).
Where devices compute for real, confined to their quotas or at host speed,
every forward, backward and optimizer step also costs the runtime's own work, per operation
and, at host speed, per byte sent or received (:mod:`.host_overhead`,
measured once on this host), at the device's speed (a confined device's
links are in the speed it calibrated, :mod:`.link_work`); at host speed the
devices share this machine's cores. One function for every figure that
sets a prediction beside a measurement: the CLI, the benchmarks and a
simulation's pipeline homes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from ecofl.devices import HomePool, host_cores, host_pool
from ecofl.errors import UserError
from ecofl.pipeline.cost import Background, SyncRoundCost, busiest_device_s, simulate
from ecofl.pipeline.first_touch import switching_s
from ecofl.pipeline.migration import Holders
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners import make_plan, plans_by_micro_batch
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.replan import full_replans
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.copy_cost import host_copy_byte_s
from ecofl.pipeline.runtime.host_overhead import runtime_overheads


def predict_sync_round(plan: Plan, profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                       rounds: int = 1, cache_dir: str | None = None,
                       copy_bytes: Mapping[int, float] | None = None) -> SyncRoundCost:
    """The cost model's sync-round of ``plan``: on the pool (confined or real: at the speeds its devices
    measured), or on its devices as processes of this machine (``emulation`` none). An asynchronous 1F1B plan
    runs a call's ``rounds`` x M micro-batches as one pass: that pass is predicted. ``copy_bytes``: the bytes
    each device seals or opens for fault tolerance in a sync-round
    (:func:`ecofl.pipeline.replication.copy_bytes`), at this host's time per byte of a copy (:mod:`.copy_cost`:
    over paced links where the pipeline paces them, else not paced) and the device's speed, beside its passes;
    devices that sleep to the cost model copy outside it (none charged)."""
    per_pass = mode_of(plan).rounds_per_pass(rounds)
    plan, devices, overheads = _as_run(plan, pool, emulation, rounds, cache_dir)
    emulation = Emulation.parse(emulation)
    if copy_bytes and emulation != Emulation.SLEEP:
        per_byte = host_copy_byte_s(paced=emulation.paces_links, cache_dir=cache_dir)
        overheads["background"] = {
            d: Background(carried * per_pass, per_byte * carried * per_pass / devices.devices[d].operation_speed)
            for d, carried in copy_bytes.items()}
    if not emulation.on_this_host:  # each device its own cores, the runtime's work at its speed too
        return simulate(plan, profile, devices, **overheads)
    return simulate(plan, profile, devices, cores=host_cores(), **overheads)


#: A floor is lowered by this fraction, so that a simulation adding the same times in another order never
#: falls below it by a rounding.
FLOOR_SLACK = 1e-9


def sync_round_floor(plan: Plan, profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                     cache_dir: str | None = None) -> float:
    """A floor under :func:`predict_sync_round`'s sync-round of ``plan`` (without copies: they only add), from
    its busiest device alone (:func:`ecofl.pipeline.cost.busiest_device_s`), without simulating a round."""
    plan, devices, overheads = _as_run(plan, pool, emulation, 1, cache_dir)
    return busiest_device_s(plan, profile, devices, **overheads) * (1 - FLOOR_SLACK)


def _as_run(plan: Plan, pool: HomePool, emulation: Emulation | bool | str, rounds: int, cache_dir: str | None
            ) -> tuple[Plan, HomePool, dict]:
    """What :func:`predict_sync_round` simulates: the plan with a pass's micro-batches, the devices (the
    pool's, or at host speed this machine's processes) and the runtime's overheads in ``emulation``."""
    per_pass = mode_of(plan).rounds_per_pass(rounds)
    plan = dataclasses.replace(plan, num_micro_batches=plan.num_micro_batches * per_pass)
    emulation = Emulation.parse(emulation)
    devices = host_pool(pool) if emulation.on_this_host else pool
    return plan, devices, dict(runtime_overheads(emulation, cache_dir))


def least(count: int, score: Callable[[int], float], floor: Callable[[int], float]) -> tuple[int, float]:
    """Branch and bound: of items ``0..count-1`` (at least one), the index of the least ``score`` and that score
    (ties: the lowest index), as scoring every item would give, where ``floor(i) <= score(i)`` for every item:
    items are scored in order of their floors, and the search stops at the first whose floor cannot win."""
    if count < 1:
        raise ValueError("no plan to choose from")
    floors = sorted((floor(i), i) for i in range(count))
    best: tuple[float, int] = (float("inf"), count)
    for bound, i in floors:
        if (bound, i) > best:
            break
        best = min(best, (score(i), i))
    return best[1], best[0]


def fastest_plan(plans: Sequence[Plan], profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                 cache_dir: str | None = None) -> tuple[Plan, float]:
    """Of ``plans`` (at least one), the one whose sync-round :func:`predict_sync_round` predicts shortest, and
    that sync-round; a plan whose floor (:func:`sync_round_floor`) already loses is not simulated. The
    runtime's per-operation work makes a plan of many small micro-batches cost more than a planner's estimate
    says: on the mixed home's presets (MobileNetV2, mini-batch 64; this 2-core host's 0.76 ms an operation,
    2026-12-01) the Eco-FL planner's 16 x 4 is 2.52 s a sync-round by its own model and 3.65 s confined, its
    8 x 8 2.94 and 3.19 s."""
    if not plans:
        raise ValueError("no plan to choose from")
    best, seconds = least(
        len(plans), lambda i: predict_sync_round(plans[i], profile, pool, emulation, cache_dir=cache_dir).sync_round_s,
        lambda i: sync_round_floor(plans[i], profile, pool, emulation, cache_dir))
    return plans[best], seconds


def quickest_to_finish(plans: Sequence[Plan], before: Plan, holders: Holders, rounds_left: int,
                       profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                       cache_dir: str | None = None) -> tuple[Plan, float]:
    """Of ``plans`` (at least one), the one that finishes a call's ``rounds_left`` sync-rounds first, with that
    time: what switching from ``before`` to it costs (its layer moves from ``holders`` over the links, and the
    memory its devices map anew in its first round: :func:`ecofl.pipeline.first_touch.switching_s`) plus
    ``rounds_left`` of its sync-rounds as :func:`predict_sync_round` predicts them. A recovery weighs what
    it moves now against how fast it trains after: with few rounds left, a plan that moves less wins; with
    many, the faster one. A plan whose floor (:func:`sync_round_floor`) already loses is not simulated: on
    Asteroid's Env D (MobileNetV2, 32 micro-batches) 3-7 of a lightweight recovery's 39-48 candidates are,
    and the choice takes 16-23 ms of the portal's CPU instead of 38-48 (timed apart, 2026-12-03)."""
    if not plans:
        raise ValueError("no plan to choose from")
    switching = [switching_s(plan, before, holders, profile, pool) for plan in plans]
    best, seconds = least(
        len(plans),
        lambda i: switching[i] + rounds_left * predict_sync_round(
            plans[i], profile, pool, emulation, cache_dir=cache_dir).sync_round_s,
        lambda i: switching[i] + rounds_left * sync_round_floor(plans[i], profile, pool, emulation, cache_dir))
    return plans[best], seconds


#: A device is left out of a plan only where that is predicted faster by more than this fraction (the margin a
#: re-tune asks, :class:`~.tuning_settings.Tuning`: planner errors of up to 5-10% are measured here).
SELECTION_MARGIN = 0.05
#: A hybrid plan (:data:`~ecofl.pipeline.replan.HYBRID_PLANNERS`) replaces the planner's own only where it is
#: predicted faster by more than this fraction, for the same reason.
HYBRID_MARGIN = SELECTION_MARGIN


def weighs_hybrid(plan: Plan | str, emulation: Emulation | bool | str) -> bool:
    """Whether a plan of ``plan``'s mode (a plan, or its schedule kind) weighs the hybrid plans (Asteroid's and
    plain data parallelism, :func:`preferred_plan`): where devices compute at their own speeds (confined, or a
    deployed home's) and the mode runs data-parallel stages."""
    return Emulation.parse(emulation).at_own_speeds and mode_of(plan).data_parallel_stages


def preferred_plan(plans: Sequence[Plan], planner: str, profile: ModelProfile, pool: HomePool,
                   emulation: Emulation | bool | str, cache_dir: str | None = None) -> tuple[Plan, float]:
    """Of ``plans`` (``planner``'s own and its hybrid planner's, :func:`~ecofl.pipeline.replan.full_replans`),
    the fastest of the planner's own (:func:`fastest_plan`) with its sync-round, unless the fastest of the
    others is predicted faster by more than :data:`HYBRID_MARGIN` or the planner has none."""
    return _own_unless_others_win(plans, planner, lambda some: fastest_plan(some, profile, pool, emulation,
                                                                            cache_dir))


def preferred_to_finish(plans: Sequence[Plan], planner: str, before: Plan, holders: Holders, rounds_left: int,
                        profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                        cache_dir: str | None = None) -> tuple[Plan, float]:
    """:func:`preferred_plan` by what finishes first (:func:`quickest_to_finish`, switching from ``before``
    included): the planner's own first to finish ``rounds_left`` sync-rounds, unless the first of the others
    finishes sooner by more than :data:`HYBRID_MARGIN`; with its time to finish."""
    return _own_unless_others_win(plans, planner, lambda some: quickest_to_finish(
        some, before, holders, rounds_left, profile, pool, emulation, cache_dir))


def _own_unless_others_win(plans: Sequence[Plan], planner: str,
                           best_of: Callable[[Sequence[Plan]], tuple[Plan, float]]) -> tuple[Plan, float]:
    """``best_of`` the planner's own ``plans``, unless ``best_of`` the others scores less by more than
    :data:`HYBRID_MARGIN` or the planner has none."""
    own = [plan for plan in plans if plan.planner == planner]
    others = [plan for plan in plans if plan.planner != planner]
    best, score = best_of(own or others)
    if own and others:
        other, other_score = best_of(others)
        if other_score < score * (1 - HYBRID_MARGIN):
            return other, other_score
    return best, score


def plan_as_run(planner: str, profile: ModelProfile, pool: HomePool, batch_size: int,
                emulation: Emulation | bool | str, cache_dir: str | None = None, hybrid: bool = True,
                **options: object) -> Plan:
    """``planner``'s plan for ``pool``; where devices compute for real and ``options`` fix no micro-batch, of its
    plans at each micro-batch size the one predicted fastest with the runtime's overheads (:func:`fastest_plan`),
    and where they compute at their own speeds (confined, or a deployed home's machines), on the devices that
    make it fastest (:func:`selected_devices`). At host speed the devices are processes of this machine at its
    speed, not the home's (:func:`~ecofl.devices.host_pool`): which of them to leave out would say nothing
    about the home. The CLI, the home service and the confined benchmark plan so;
    ``hybrid=False`` weighs only the planner's own plans (for a schedule that runs one device a stage: Asteroid's
    planner may give a stage several)."""
    emulation = Emulation.parse(emulation)
    if "micro_batch" in options or emulation == Emulation.SLEEP:
        return make_plan(planner, profile, pool, batch_size, **options)
    if emulation.at_own_speeds:
        return selected_devices(planner, profile, pool, batch_size, emulation, cache_dir, hybrid=hybrid,
                                **options)[0]
    return fastest_plan(plans_by_micro_batch(planner, profile, pool, batch_size, **options), profile, pool,
                        emulation, cache_dir)[0]


def selected_devices(planner: str, profile: ModelProfile, pool: HomePool, batch_size: int,
                     emulation: Emulation | bool | str, cache_dir: str | None = None,
                     margin: float = SELECTION_MARGIN, hybrid: bool = True, **options: object) -> tuple[Plan, float]:
    """Device selection (PipeEdge §III-B: a pipeline need not use every device): ``planner``'s fastest plan
    (:func:`fastest_plan`) on every device of ``pool``, then, one at a time, without the device whose absence
    makes it fastest, for as long as that is predicted faster by more than ``margin`` (the cost model's own
    uncertainty: a device is not idled for a gain the model cannot tell from its error); with its sync-round.
    With ``hybrid``, the same selection runs again with the hybrid plans (Asteroid's data-parallel stage groups
    and plain data parallelism, :func:`~ecofl.pipeline.replan.full_replans`) weighed on each set of devices
    (:func:`preferred_plan`), and its plan replaces the planner's own where it is predicted faster by more than
    :data:`HYBRID_MARGIN`, or where the planner has none (Eco-FL's on fewer layers than devices). Two paths,
    because the removal is greedy: a hybrid plan that keeps a slow device busy with a small share can beat
    each single removal and still lose to two (the FedAvg CNN on the mixed home's presets, mini-batch 64:
    Asteroid's plan on all four devices predicted at 0.217 s a sync-round, the Eco-FL planner's on the TX2 and
    the phone at 0.168 s, this host's records).

    The portal (device 0) holds the data and selection never leaves it out (Asteroid's planner itself plans
    without a device only where the model fits in no other way); devices the model does not fit in without the
    one left out are no candidate. A device too slow for the smallest stage the layers allow costs the pipeline
    more than it gives: on the mixed home's calibration of 2026-12-04 18:15 (MobileNetV2, mini-batch 64), the
    Eco-FL planner's fastest plan with the Raspberry Pi (0.025 cores) was predicted at 2.84 s a sync-round and
    without it at 2.66 s. A device left out idles: the pipeline starts no worker for it, so a re-plan after a
    failure plans without it, unless it joins."""
    planned: dict[tuple[int, ...], list[Plan]] = {}

    def plans_on(devices: tuple[int, ...]) -> list[Plan]:
        if devices not in planned:
            planned[devices] = full_replans(planner, profile, pool, devices, batch_size, hybrid=hybrid, **options)
        return planned[devices]

    def fastest_on(devices: tuple[int, ...], weighing_hybrid: bool) -> tuple[Plan, float]:
        plans = plans_on(devices)
        if not weighing_hybrid:
            plans = [plan for plan in plans if plan.planner == planner] or plans
        return preferred_plan(plans, planner, profile, pool, emulation, cache_dir)

    own, own_s = _selected(lambda devices: fastest_on(devices, False), len(pool.devices), margin)
    if not hybrid:
        return own, own_s
    weighed, weighed_s = _selected(lambda devices: fastest_on(devices, True), len(pool.devices), margin)
    return (weighed, weighed_s) if weighed_s < own_s * (1 - HYBRID_MARGIN) else (own, own_s)


def _selected(fastest_on: Callable[[tuple[int, ...]], tuple[Plan, float]], devices: int,
              margin: float) -> tuple[Plan, float]:
    """Greedy removal (:func:`selected_devices`): from every device, without the one (never the portal, 0)
    whose absence makes ``fastest_on`` fastest, while that is faster by more than ``margin``; a set the model
    does not fit in (a :class:`UserError`) is no candidate."""
    kept = tuple(range(devices))

    def without(out: int) -> tuple[Plan, float, int] | None:
        try:
            return (*fastest_on(tuple(d for d in kept if d != out)), out)
        except UserError:  # the model does not fit in the devices left
            return None

    best, seconds = fastest_on(kept)
    while len(kept) > 1:
        trials = [trial for out in kept if out != 0 and (trial := without(out)) is not None]
        if not trials:
            break
        plan, trial_s, out = min(trials, key=lambda trial: trial[1])
        if trial_s >= seconds * (1 - margin):
            break
        best, seconds, kept = plan, trial_s, tuple(d for d in kept if d != out)
    return best, seconds
