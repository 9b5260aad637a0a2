"""Planners: which devices run which layers, with what micro-batch and forward tasks in flight.

Every planner maps (profile, pool, mini-batch size) to a
:class:`ecofl.pipeline.plan.Plan` whose ``micro_batch * num_micro_batches``
equals the mini-batch (micro-batch sizes are its divisors), whose stages keep
K_s = min(P_s, Q_s, M) forward tasks (P_s = 2(S-s)-1, Q_s from memory) and
run 1F1B-Sync:

========  ======================================================================
ecofl     Eco-FL §4.2-4.3: DP of eq. 1, device-order and micro-batch search
hpp       Asteroid §3.3: Algorithm 2 over data-parallel stage groups, Algorithm 1
pipeedge  PipeEdge §III-B: DP choosing device subset and order (category compression)
even      equal layers (or FLOPs) per device in pool order (GPipe / PipeDream style)
dp        data parallel: whole model everywhere, samples by speed, one AllReduce
========  ======================================================================

A model that fits the pool in no way raises :class:`ecofl.errors.UserError`
naming the tightest device and the bytes it misses.

Every planner also plans **inference** (``make_plan(..., objective="inference")``,
PipeEdge's problem): forward times only, transfers of activations only, memory
= weights + in-flight activations (no gradients, no optimizer state, nothing
stashed for backward), three micro-batches held per stage; the plan's
schedule is ``"stream"`` and :func:`ecofl.pipeline.stream.simulate_stream`
predicts its throughput and latency.
"""

from __future__ import annotations

import inspect
from typing import Callable

from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.planners.baselines import plan_dp, plan_even
from ecofl.pipeline.planners.ecofl import plan_ecofl
from ecofl.pipeline.planners.hpp import plan_hpp
from ecofl.pipeline.planners.memory import micro_batch_candidates
from ecofl.pipeline.planners.pipeedge import plan_pipeedge
from ecofl.pipeline.planners.tables import check_objective
from ecofl.pipeline.profile import ModelProfile

PLANNERS: dict[str, Callable[..., Plan]] = {
    "ecofl": plan_ecofl,
    "hpp": plan_hpp,
    "pipeedge": plan_pipeedge,
    "even": plan_even,
    "dp": plan_dp,
}


def check_planner(name: str) -> str:
    """``name`` if it is a planner; else a UserError listing the planners (the one place that says so)."""
    if name not in PLANNERS:
        raise UserError(f"unknown planner {name!r}; valid planners: {', '.join(PLANNERS)}")
    return name


def make_plan(
    planner: str, profile: ModelProfile, pool: HomePool, batch_size: int, objective: str = "training",
    **options: object,
) -> Plan:
    """Plan ``profile`` on ``pool`` for mini-batches of ``batch_size`` with the named planner.

    ``objective`` is ``"training"`` (1F1B-Sync sync-rounds of ``batch_size``
    samples) or ``"inference"`` (a forward-only stream; ``batch_size`` is the
    horizon over which micro-batch sizes, its divisors, are compared).
    ``options`` are the planner's keyword arguments (``micro_batch`` for all,
    ``micro_batch_rule`` for ecofl and pipeedge, ``sizes`` and ``block`` for
    hpp, ``balance`` for even); an unknown one is a UserError.
    """
    check_planner(planner)
    check_objective(objective)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, got {batch_size!r}")
    function = PLANNERS[planner]
    accepted = set(inspect.signature(function).parameters) - {"profile", "pool", "batch_size", "objective"}
    unknown = set(options) - accepted
    if unknown:
        raise UserError(
            f"planner {planner!r} takes no option {', '.join(sorted(unknown))}; "
            f"its options: {', '.join(sorted(accepted))}"
        )
    micro_batch = options.get("micro_batch")
    if micro_batch is not None and (not isinstance(micro_batch, int) or micro_batch < 1 or batch_size % micro_batch):
        raise UserError(f"micro-batch {micro_batch!r} must be a positive divisor of the batch size {batch_size}")
    return function(profile, pool, batch_size, objective=objective, **options)


def plans_by_micro_batch(planner: str, profile: ModelProfile, pool: HomePool, batch_size: int,
                         **options: object) -> list[Plan]:
    """``planner``'s plan at each micro-batch size that fills a pipeline of two stages or more
    (:func:`.memory.micro_batch_candidates` at two stages: at least 3 micro-batches), for a caller that compares
    them with costs the planner's own estimate leaves out (the runtime's per-operation work,
    :func:`ecofl.pipeline.runtime.prediction.fastest_plan`); a size the devices' memory refuses is left out (if
    every size is, the last refusal is raised). Not only the sizes that fill one stage per device (the planners'
    own rule, M >= 2N - 1): a hybrid plan has fewer stages than devices, and the runtime's work per operation
    favours fewer, larger micro-batches; the prediction simulates the bubbles of a size that fills too few. On
    Asteroid's Env B (MobileNetV2, mini-batch 64, the speeds its confined devices measured on 2026-12-05 18:27)
    HPP's 8 x 8 on four stages is predicted at 50.1 samples/s, the hybrid 16 x 4 that ran at the planners' sizes
    at 46.0 (0.944 of its bound; measured 44.4, 0.91); chosen at 21:40, 8 x 8 measured 53.0 (1.07). Data
    parallelism has no pipeline to fill: its one plan is at the largest micro-batch its devices hold (a
    pipeline's few samples a call would leave devices without a share)."""
    if planner == "dp" and "micro_batch" not in options:
        return [make_plan(planner, profile, pool, batch_size, **options)]
    plans, refused = [], None
    for size in micro_batch_candidates(batch_size, num_devices=2):
        try:
            plans.append(make_plan(planner, profile, pool, batch_size, micro_batch=size, **options))
        except UserError as error:
            refused = error
    if not plans and refused is not None:
        raise refused
    return plans
