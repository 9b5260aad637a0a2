"""A search over plans skips the plans that cannot win, and still chooses what scoring every plan chooses
(ecofl.pipeline.runtime.prediction: ``least``, ``sync_round_floor``, ``fastest_plan``, ``quickest_to_finish``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from ecofl.pipeline.migration import layer_owners
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners import make_plan, plans_by_micro_batch
from ecofl.pipeline.replan import lightweight_replans, shifted_replans
from ecofl.pipeline.runtime import prediction
from ecofl.pipeline.first_touch import switching_s
from ecofl.pipeline.schedule import ScheduleKind
from ecofl.pools import load_pool
from pipeline_kit import random_profile

TRAINING = [kind for kind in ScheduleKind if kind != ScheduleKind.STREAM]


@pytest.fixture
def measured_overheads(monkeypatch):
    """The runtime's overheads this host would measure, fixed: a millisecond an operation, a nanosecond a byte."""
    def overheads(emulation, cache_dir=None):
        return {} if str(emulation) == "sleep" else {"operation_overhead_s": 1e-3, "byte_overhead_s": 1e-9}
    monkeypatch.setattr(prediction, "runtime_overheads", overheads)


def test_least_is_the_exhaustive_minimum_ties_to_the_lowest_index_and_scores_fewer():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 12))
        scores = rng.choice([1.0, 2.0, 2.5, 3.0], size=n)  # many ties
        floors = scores - rng.uniform(0.0, 1.5, size=n) * rng.integers(0, 2, size=n)  # some floors exact
        index, score = prediction.least(n, lambda i: scores[i], lambda i: floors[i])
        assert (score, index) == min((scores[i], i) for i in range(n))
    scored = []
    exact = [5.0, 4.0, 3.0, 2.0, 1.0]
    assert prediction.least(5, lambda i: scored.append(i) or exact[i], lambda i: exact[i]) == (4, 1.0)
    assert scored == [4]  # every other floor already loses
    with pytest.raises(ValueError, match="no plan"):
        prediction.least(0, lambda i: 0.0, lambda i: 0.0)


@pytest.mark.parametrize("emulation", ["sleep", "cgroup", "none"])
def test_a_floor_is_under_the_predicted_sync_round_of_every_schedule(emulation, measured_overheads):
    rng = np.random.default_rng(3)
    profile = random_profile(rng, 14)
    checked = dict.fromkeys(TRAINING, 0)
    for pool_name in ("asteroid-d", "ecofl-3stage", "mixed-rpi"):
        pool = load_pool(pool_name)
        for planner in ("ecofl", "hpp"):
            for planned in plans_by_micro_batch(planner, profile, pool, 32):
                for kind in TRAINING:
                    try:
                        plan = dataclasses.replace(planned, schedule=kind)
                    except ValueError:  # asynchronous 1F1B has no data-parallel stage
                        continue
                    floor = prediction.sync_round_floor(plan, profile, pool, emulation)
                    predicted = prediction.predict_sync_round(plan, profile, pool, emulation).sync_round_s
                    assert 0 < floor <= predicted
                    checked[kind] += 1
    assert all(checked.values()), checked


def test_a_recovery_chooses_as_if_it_had_simulated_every_candidate_and_simulates_few(measured_overheads,
                                                                                      monkeypatch):
    profile = random_profile(np.random.default_rng(7), 22)
    pool = load_pool("asteroid-d")
    plan = make_plan("ecofl", profile, pool, 32)
    simulated = []
    predict = prediction.predict_sync_round
    monkeypatch.setattr(prediction, "predict_sync_round", lambda *a, **k: simulated.append(a[0]) or predict(*a, **k))
    for lost in range(len(pool.devices)):
        holders = {layer: [d for d in owners if d != lost] or [(lost + 1) % len(pool.devices)]
                   for layer, owners in layer_owners(plan).items()}
        proportional = lightweight_replans(plan, profile, pool, lost={lost})
        best = prediction.fastest_plan(proportional, profile, pool, "cgroup")[0]
        candidates = [best, *shifted_replans(best, profile, pool)]
        for rounds_left in (1, 4, 100):
            simulated.clear()
            chosen, seconds = prediction.quickest_to_finish(candidates, plan, holders, rounds_left, profile, pool,
                                                            "cgroup")
            assert len(simulated) < len(candidates)
            every = [(switching_s(c, plan, holders, profile, pool)
                      + rounds_left * predict(c, profile, pool, "cgroup").sync_round_s, i)
                     for i, c in enumerate(candidates)]
            assert (seconds, candidates.index(chosen)) == min(every)


def test_the_runtime_weighs_every_size_that_fills_two_stages_not_only_one_stage_a_device():
    """A hybrid plan has fewer stages than devices: on five devices, 8 micro-batches fill HPP's four stages
    (P_0 = 7) though not five (9), and are weighed; 2 fill no pipeline and are not."""
    profile = random_profile(np.random.default_rng(5), 22)
    pool = load_pool("asteroid-b")
    weighed = {plan.micro_batch for plan in plans_by_micro_batch("hpp", profile, pool, 64)}
    assert {16, 8, 4} <= weighed and 32 not in weighed
    assert make_plan("hpp", profile, pool, 64).micro_batch <= 4  # the planner's own rule: M >= 2N - 1


def test_a_hybrid_plan_finishes_first_only_beyond_the_margin(monkeypatch):
    """A re-tune's choice (``preferred_to_finish``): the planner's own plan that finishes first, unless a hybrid
    one finishes sooner by more than ``HYBRID_MARGIN``, as ``preferred_plan`` weighs sync-rounds."""
    stage = StagePlan((0, 5), (0, 1), (2, 2), 1)
    own, hybrid = (Plan(name, (stage,), 4, 1) for name in ("ecofl", "hpp"))
    finish_s = {"ecofl": 10.0, "hpp": 10.0 * (1 - prediction.HYBRID_MARGIN) + 0.01}

    def quickest(plans, *args):
        return min(((plan, finish_s[plan.planner]) for plan in plans), key=lambda pair: pair[1])

    monkeypatch.setattr(prediction, "quickest_to_finish", quickest)

    def choose() -> tuple[Plan, float]:
        return prediction.preferred_to_finish([hybrid, own], "ecofl", own, {}, 3, None, None, "cgroup")

    assert choose() == (own, 10.0)
    finish_s["hpp"] -= 0.02
    assert choose() == (hybrid, finish_s["hpp"])
    assert prediction.preferred_to_finish([hybrid], "ecofl", own, {}, 3, None, None, "cgroup")[0] is hybrid
