"""The event loop: virtual-time order, determinism, rejection of bad updates, checkpoints, policies."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from ecofl.errors import UserError
from ecofl.fl.aggregation import weighted_mean
from ecofl.fl.inprocess import InProcessTransport
from ecofl.fl.clock import WallClock
from ecofl.fl.latency import FixedLatency, PaperLatency
from ecofl.fl.group_round import GroupRound
from ecofl.fl.loop import EventLoop, resume_loop
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.stop_rules import STOPPED
from ecofl.fl.transport import RunStopped, TrainTask
from ecofl.train import evaluate as evaluate_model
from ecofl.weights import get_weights, set_weights

CLASSES, FEATURES, HOMES = 6, 8, 24
TRAIN = {"epochs": 1, "batch_size": 10, "lr": 0.1, "mu": 0.05}


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.ReLU(), torch.nn.Linear(16, CLASSES))


def synthetic(seed, per_class):
    """Gaussian classes around fixed means; ``seed`` draws the samples."""
    means = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 2.0
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    x = means[y] + torch.randn(len(y), FEATURES, generator=g)
    return x, y


X, Y = synthetic(0, per_class=150)
X_TEST, Y_TEST = synthetic(1, per_class=30)


def two_class_parts(num_homes=HOMES, seed=0):
    """Each home holds two classes (Eco-FL §6.1)."""
    rng = np.random.default_rng(seed)
    by_class = {c: rng.permutation(np.flatnonzero(Y.numpy() == c)).tolist() for c in range(CLASSES)}
    parts = []
    for h in range(num_homes):
        classes = [h % CLASSES, (h + 1 + h // CLASSES) % CLASSES]
        parts.append(np.array([by_class[c].pop() for c in classes for _ in range(12)]))
    return parts


def initial_weights():
    torch.manual_seed(0)
    return get_weights(make_model())


def evaluate(weights):
    model = make_model()
    set_weights(model, weights)
    result = evaluate_model(model, X_TEST, Y_TEST)
    return result.loss, result.accuracy


def make_loop(config, latency=None, out_dir=None, **transport_kwargs):
    latency = latency or PaperLatency(HOMES, mean_s=10.0, std_s=3.0, seed=0, change_prob=0.3)
    transport = InProcessTransport(make_model, X, Y, two_class_parts(), latency, **transport_kwargs)
    loop = EventLoop(config, transport, range(HOMES), initial_weights(), evaluate, out_dir=out_dir, progress=False)
    return loop, transport


def without_wall_time(rows):
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]


def test_runs_are_identical_whatever_order_replies_come_back_in():
    config = LoopConfig(num_groups=3, homes_per_round=3, max_updates=25, train=TRAIN, requery_every=5)
    first, _ = make_loop(config, shuffle_replies_seed=1)
    second, _ = make_loop(config, shuffle_replies_seed=2)
    rows = first.run()
    assert len(rows) == 25
    assert without_wall_time(rows) == without_wall_time(second.run())
    times = [r["virtual_time"] for r in rows]
    assert times == sorted(times)
    assert len({r["group"] for r in rows}) == 3
    assert rows[-1]["accuracy"] > 0.4 > rows[0]["accuracy"]
    assert max(r["staleness"] for r in rows) > 0


def test_homes_trained_in_this_process_keep_freed_memory(monkeypatch):
    """As the pipeline's workers do (ecofl.allocator): the in-process transport, which trains homes in this
    process, sets it."""
    kept = []
    monkeypatch.setattr("ecofl.fl.inprocess.keep_freed_memory", lambda: kept.append(True) or True)
    config = LoopConfig(strategy="fedavg", max_concurrent=HOMES, max_updates=2, round_deadline="none", train=TRAIN)
    loop, transport = make_loop(config)
    assert len(loop.run()) == 2 and transport.tasks_run > 0
    assert kept


def test_a_nan_update_is_rejected_and_the_run_goes_on():
    config = LoopConfig(strategy="fedavg", max_concurrent=HOMES, max_updates=4, round_deadline="none", train=TRAIN)
    loop, _ = make_loop(config, nan_homes={3}, failing_homes={5})
    rows = loop.run()
    assert len(rows) == 4
    assert all(r["rejected"] == 1 and r["failed"] == 1 and r["homes"] == HOMES - 2 for r in rows)
    assert rows[-1]["rejected_total"] == 4
    assert all(np.isfinite(w).all() for w in loop.global_weights)
    assert np.isfinite(rows[-1]["loss"]) and rows[-1]["accuracy"] > 0.3


def test_fedavg_applies_the_weighted_mean_of_one_synchronous_round():
    config = LoopConfig(strategy="fedavg", max_concurrent=HOMES, max_updates=1, round_deadline="none", train=TRAIN)
    loop, transport = make_loop(config, latency=FixedLatency(np.linspace(1, 5, HOMES)))
    start = [w.copy() for w in loop.global_weights]
    rows = loop.run()
    assert rows[0]["alpha"] == 1.0 and rows[0]["staleness"] == 1 and rows[0]["virtual_time"] == 5.0
    # the same homes trained by hand from the same start and the same seeds
    sent = GroupRound(group=0, round=0, dispatch=0, start=0.0, version=0, homes=tuple(range(HOMES)), deadline=None,
                      weights=start)
    replies = transport.train([loop.task(sent, h) for h in range(HOMES)])
    expected = weighted_mean([r.weights for r in replies], [r.num_samples for r in replies])
    for got, want in zip(loop.global_weights, expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_group_twice_as_fast_applies_about_twice_as_many_updates():
    latencies = [1.0 if h < HOMES // 2 else 2.0 for h in range(HOMES)]
    config = LoopConfig(num_groups=2, lam=0.0, rt=0.2, homes_per_round=3, max_updates=60, eval_every=60, train=TRAIN)
    loop, _ = make_loop(config, latency=FixedLatency(latencies))
    rows = loop.run()
    counts = Counter(r["group"] for r in rows)
    assert loop.grouping.centres == (1.0, 2.0)
    assert counts[0] / counts[1] == pytest.approx(2.0, rel=0.2)


@pytest.mark.parametrize("strategy", ["ecofl", "fedat"])  # FedAT's checkpoint holds every tier's latest model
def test_resuming_from_a_checkpoint_gives_the_same_metrics_as_not_stopping(tmp_path, strategy):
    config = LoopConfig(strategy=strategy, num_groups=3, homes_per_round=3, max_updates=20, checkpoint_every=8,
                        train=TRAIN, requery_every=3)
    full, _ = make_loop(config, out_dir=tmp_path / "full", shuffle_replies_seed=3)
    rows = full.run()
    checkpoint = tmp_path / "full" / "checkpoints" / "update_000008.json"
    assert checkpoint.is_file() and checkpoint.with_suffix(".npz").is_file()
    assert (tmp_path / "full" / "metrics.csv").is_file() and (tmp_path / "full" / "summary.json").is_file()
    latency = PaperLatency(HOMES, mean_s=10.0, std_s=3.0, seed=0, change_prob=0.3)
    transport = InProcessTransport(make_model, X, Y, two_class_parts(), latency, shuffle_replies_seed=4)
    resumed = resume_loop(checkpoint, transport, evaluate, out_dir=tmp_path / "resumed", progress=False)
    assert resumed.version == 8 and len(resumed.in_flight) == 3
    assert without_wall_time(resumed.run()) == without_wall_time(rows)
    for a, b in zip(resumed.global_weights, full.global_weights):
        np.testing.assert_array_equal(a, b)


def test_stragglers_beyond_the_deadline_are_left_out():
    latencies = [1.0] * (HOMES - 4) + [9.0] * 4
    config = LoopConfig(strategy="fedavg", max_concurrent=HOMES, max_updates=2, round_deadline="factor",
                        round_deadline_factor=1.5, train=TRAIN)
    loop, _ = make_loop(config, latency=FixedLatency(latencies))
    rows = loop.run()
    # the 4 late homes are still training when the next round goes out (busy until 9 s): it takes the others
    assert [r["stragglers"] for r in rows] == [4, 0]
    assert [r["homes"] for r in rows] == [HOMES - 4] * 2
    # a round with late homes closes at its deadline (1.5 x the one group's mean latency), not at its last
    # on-time reply: the server cannot know the late homes will not come before it
    deadline = 1.5 * float(np.mean(latencies))
    assert deadline + 1.0 < 9.0
    assert [r["virtual_time"] for r in rows] == pytest.approx([deadline, deadline + 1.0])
    times = [t for r in rows for t in (r["round_started_s"], r["round_closed_s"], r["deadline_s"])]
    assert times == pytest.approx([0.0, deadline, deadline, deadline, deadline + 1.0, 2 * deadline])


@pytest.mark.parametrize("strategy", ["ecofl_wo_dg", "fedasync", "fedat", "astraea"])
def test_every_policy_runs_on_the_one_loop(strategy):
    config = LoopConfig(strategy=strategy, num_groups=3, homes_per_round=2, max_concurrent=6, max_updates=12,
                        train=TRAIN)
    loop, _ = make_loop(config)
    rows = loop.run()
    assert len(rows) == 12
    assert all(0 < r["alpha"] <= 1 for r in rows)
    if strategy == "fedasync":
        assert all(r["homes"] == 1 for r in rows) and len(rows[0]["group_sizes"]) == HOMES
        assert len({r["group"] for r in rows}) > 6  # the concurrency cap rotates homes
    else:
        assert len(rows[0]["group_sizes"]) == 3


def test_dynamic_latency_moves_homes_between_groups_only_with_regrouping():
    config = LoopConfig(num_groups=3, homes_per_round=3, max_updates=30, requery_every=2, rt=2.0, train=TRAIN,
                        eval_every=30)
    latency = PaperLatency(HOMES, mean_s=10.0, std_s=1.0, seed=0, change_prob=0.5, period_s=5.0)
    dynamic, _ = make_loop(config, latency=latency)
    initial = None
    dynamic.profile()
    initial = dynamic.grouping
    dynamic.dispatch()
    dynamic.run()
    assert dynamic.grouping != initial
    for members, centre in zip(dynamic.grouping.groups, dynamic.grouping.centres):
        assert all(abs(dynamic.state.latencies[h] - centre) <= 2.0 for h in members)
    static, _ = make_loop(LoopConfig(**{**config.__dict__, "strategy": "ecofl_wo_dg"}), latency=latency)
    static.run()
    assert static.grouping == initial


def test_unknown_strategy_lists_the_valid_ones():
    from ecofl.fl.loop_config import STRATEGIES
    from ecofl.fl.strategies import POLICIES

    assert tuple(POLICIES) == STRATEGIES  # the config checks names without importing the policies
    with pytest.raises(UserError, match="ecofl, ecofl_wo_dg, fedavg, fedasync, fedat, astraea, fedat_equal_weights"):
        LoopConfig(strategy="scaffold")
    with pytest.raises(UserError, match="alpha"):
        LoopConfig(alpha=0.0)
    with pytest.raises(UserError, match="round_deadline must be one of rt, none, factor"):
        LoopConfig(round_deadline="centre")
    with pytest.raises(UserError, match="round_deadline_factor is set exactly when"):
        LoopConfig(round_deadline_factor=2.0)
    with pytest.raises(UserError, match="fresh_staleness"):
        LoopConfig(fresh_staleness=2)


class RecordingTransport:
    """The in-process transport, remembering every reply by (group, group round)."""

    def __init__(self, inner):
        self.inner = inner
        self.replies = {}

    def query(self, homes, virtual_time):
        return self.inner.query(homes, virtual_time)

    def train(self, tasks):
        replies = self.inner.train(tasks)
        route = {t.home: t.route for t in tasks}
        for reply in replies:
            self.replies.setdefault((route[reply.home].group, route[reply.home].round), []).append(reply)
        return replies


def recorded_loop(config, latencies):
    inner = InProcessTransport(make_model, X, Y, two_class_parts(), FixedLatency(latencies))
    transport = RecordingTransport(inner)
    loop = EventLoop(config, transport, range(HOMES), initial_weights(), evaluate, progress=False)
    return loop, transport


def round_model(transport, row):
    """The group model of the round behind metrics row ``row``: its replies' sample-weighted mean."""
    replies = sorted(transport.replies[(row["group"], row["group_round"])], key=lambda r: r.home)
    return weighted_mean([r.weights for r in replies], [r.num_samples for r in replies])


def three_tiers(strategy: str):
    """Three tiers of 8 homes answering in 1, 2 and 4 s, 7 updates: by t = 4 s tier 0 has updated 4 times,
    tier 1 twice and tier 2 once (ties at equal times go to the lower tier). The rows, the final global
    model and each tier's last round model."""
    latencies = [1.0] * 8 + [2.0] * 8 + [4.0] * 8
    config = LoopConfig(strategy=strategy, num_groups=3, homes_per_round=2, max_updates=7, train=TRAIN)
    loop, transport = recorded_loop(config, latencies)
    rows = loop.run()
    assert [r["group"] for r in rows] == [0, 0, 1, 0, 0, 1, 2]
    latest = {row["group"]: round_model(transport, row) for row in rows}
    return rows, loop.global_weights, latest


def test_fedat_global_model_is_the_count_weighted_average_of_every_tiers_latest_model():
    """Chai et al. SC'21: after every tier update, w = sum_i T_(M+1-i) / T w_tier_i."""
    # after the 7th update T = 7 and the weights are 1/7, 2/7 and 4/7 (the slowest, least-updated tier weighs most)
    rows, global_weights, latest = three_tiers("fedat")
    expected = [(1 * a + 2 * b + 4 * c) / 7 for a, b, c in zip(latest[0], latest[1], latest[2])]
    for got, want in zip(global_weights, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert rows[-1]["alpha"] == pytest.approx(4 / 7)
    # after the 3rd update (tier 0 twice, tier 1 once): weights 1/3 and 2/3
    assert rows[2]["alpha"] == pytest.approx(2 / 3)
    # the first update: tier 0 alone is the global model (the tiers without a model are not averaged)
    assert rows[0]["alpha"] == pytest.approx(1.0)


def test_fedat_with_equal_weights_averages_every_tiers_latest_model_alike():
    """The ablation: the same tiers and rounds as FedAT, every tier's latest model weighed 1/M."""
    rows, global_weights, latest = three_tiers("fedat_equal_weights")
    for got, a, b, c in zip(global_weights, latest[0], latest[1], latest[2]):
        np.testing.assert_allclose(got, (a + b + c) / 3, rtol=1e-5, atol=1e-7)
    assert [r["alpha"] for r in rows] == pytest.approx([1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1 / 3])


@pytest.mark.parametrize("fresh, factor", [(1, 2 ** -0.5), (0, 1.0)])
def test_fedasync_mixes_a_fresh_update_with_alpha_times_s_of_its_staleness(fresh, factor):
    """Xie et al.: x_t = (1 - a) x_(t-1) + a x_new with a = alpha * s(t - tau); a fresh update has t - tau = 1."""
    latencies = list(np.linspace(1.0, 3.0, HOMES))
    config = LoopConfig(strategy="fedasync", alpha=0.6, staleness="polynomial", staleness_a=0.5,
                        max_concurrent=4, max_updates=1, fresh_staleness=fresh, train=TRAIN)
    loop, transport = recorded_loop(config, latencies)
    start = [w.copy() for w in loop.global_weights]
    rows = loop.run()
    alpha_t = 0.6 * factor  # polynomial s(1) = (1 + 1)^-0.5; s(0) = 1
    assert rows[0]["staleness"] == fresh and rows[0]["alpha"] == pytest.approx(alpha_t)
    new = round_model(transport, rows[0])
    for got, old, mixed_in in zip(loop.global_weights, start, new):
        np.testing.assert_allclose(got, (1 - alpha_t) * old + alpha_t * mixed_in, rtol=1e-5, atol=1e-7)


ROUND_STRATEGIES = ["ecofl", "ecofl_wo_dg", "fedavg", "fedat", "astraea"]


@pytest.mark.parametrize("strategy", ROUND_STRATEGIES + ["fedasync"])
@pytest.mark.parametrize("rule", ["rt", "none", "factor"])
def test_one_round_deadline_rule_for_every_strategy_with_rounds(strategy, rule):
    config = LoopConfig(strategy=strategy, num_groups=3, homes_per_round=2, max_concurrent=6, rt=0.7,
                        round_deadline=rule, round_deadline_factor=1.5 if rule == "factor" else None, train=TRAIN)
    loop, _ = make_loop(config, latency=FixedLatency(np.linspace(1.0, 5.0, HOMES)))
    loop.profile()
    loop.dispatch()
    assert loop.in_flight
    for r in loop.in_flight.values():
        centre = loop.grouping.centres[r.group]
        expected = {"rt": centre + 0.7, "none": None, "factor": 1.5 * centre}[rule]
        if strategy == "fedasync":  # single homes applied as they arrive: no round to wait for
            expected = None
        assert r.deadline == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("strategy", ["fedavg", "fedat", "astraea"])
def test_the_default_deadline_drops_the_baselines_stragglers_too(strategy):
    """Homes slower than their group's centre + RT are left out, whatever the strategy (default rule)."""
    config = LoopConfig(strategy=strategy, num_groups=3, homes_per_round=8, max_concurrent=HOMES, rt=0.3,
                        max_updates=4, train=TRAIN)
    latencies = np.linspace(1.0, 5.0, HOMES)
    loop, _ = make_loop(config, latency=FixedLatency(latencies))
    rows = loop.run()
    assert sum(r["stragglers"] for r in rows) > 0
    waited, _ = make_loop(LoopConfig(**{**config.__dict__, "round_deadline": "none"}), latency=FixedLatency(latencies))
    assert sum(r["stragglers"] for r in waited.run()) == 0


def test_virtual_time_limit_and_target_accuracy_stop_the_run(tmp_path):
    config = LoopConfig(num_groups=3, homes_per_round=3, max_updates=1000, max_virtual_time_s=40.0, eval_every=1000,
                        train=TRAIN)
    loop, _ = make_loop(config, out_dir=tmp_path)
    rows = loop.run()
    assert loop.stop_reason == "max_virtual_time_s" and rows[-1]["virtual_time"] <= 40.0
    assert rows[-1]["accuracy"] is not None and all(r["accuracy"] is None for r in rows[:-1])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["updates"] == len(rows) and summary["final_accuracy"] == rows[-1]["accuracy"]
    target, _ = make_loop(LoopConfig(num_groups=3, homes_per_round=3, max_updates=1000, target_accuracy=0.5,
                                     train=TRAIN))
    rows = target.run()
    assert target.stop_reason == "target_accuracy" and rows[-1]["accuracy"] >= 0.5 > rows[-2]["accuracy"]
    assert target.summary()["time_to_target_s"] == rows[-1]["virtual_time"]


def test_eval_every_s_evaluates_the_first_update_past_each_period():
    """Evaluation by virtual time: one point per 10 s window an update lands in, whatever the update rate."""
    config = LoopConfig(num_groups=3, homes_per_round=3, max_updates=40, eval_every_s=10.0, train=TRAIN)
    loop, _ = make_loop(config)
    rows = loop.run()
    evaluated = [r["virtual_time"] for r in rows if r["accuracy"] is not None]
    windows = sorted({int(r["virtual_time"] // 10) for r in rows if r["virtual_time"] >= 10})
    first_of_each = [min(r["virtual_time"] for r in rows if r["virtual_time"] // 10 == w) for w in windows]
    assert evaluated[:-1] == first_of_each[: len(evaluated) - 1] and evaluated[-1] == rows[-1]["virtual_time"]
    assert len(rows) > 2 * len(evaluated)  # several updates per window: most are not evaluated
    with pytest.raises(UserError, match="eval_every_s"):
        LoopConfig(eval_every_s=0.0)


def wall_loop(config, latencies, **transport_kwargs):
    """A wall-clock loop whose homes answer ``latencies`` seconds after a round is sent (plus training)."""
    transport = InProcessTransport(make_model, X, Y, two_class_parts(), FixedLatency(latencies), **transport_kwargs)
    transport.train([TrainTask(0, initial_weights(), TRAIN)])  # torch's first training is slow: not in the timings
    loop = EventLoop(config, transport, range(HOMES), initial_weights(), evaluate, clock=WallClock(), progress=False)
    return loop, transport


def test_the_wall_clock_applies_each_round_when_its_last_reply_arrives():
    """A group 6x faster applies its rounds while the slow group's first round is still out."""
    latencies = [0.2 if h < HOMES // 2 else 1.2 for h in range(HOMES)]
    config = LoopConfig(num_groups=2, lam=0.0, homes_per_round=2, max_updates=10,
                        train=TRAIN)
    loop, _ = wall_loop(config, latencies)
    rows = loop.run()
    groups = [r["group"] for r in rows]
    assert groups[:2] == [0, 0] and 1 in groups and groups.count(0) > groups.count(1)
    first_slow = rows[groups.index(1)]
    assert first_slow["virtual_time"] >= 1.2  # sent at the start, answered after its 1.2 s latency
    assert [r["virtual_time"] for r in rows] == sorted(r["virtual_time"] for r in rows)


def test_the_wall_clock_closes_a_round_at_its_deadline_without_a_silent_home():
    config = LoopConfig(strategy="fedavg", max_concurrent=HOMES, max_updates=2, round_deadline="factor",
                        round_deadline_factor=25.0,
                        train=TRAIN)
    loop, _ = wall_loop(config, [0.02] * HOMES, reply_timeout_s=30.0)  # well past the deadline, however loaded
    loop.profile()  # home 5 answers the query, then falls silent
    loop.transport.silent_homes = {5}
    loop.dispatch()
    rows = loop.run()
    # the silent home stays busy until the transport gives up on it (30 s): the second round goes on without it
    assert [r["stragglers"] for r in rows] == [1, 0] and [r["homes"] for r in rows] == [HOMES - 1] * 2
    deadline = 25.0 * loop.grouping.centres[0]
    # closed at its deadline (later on a loaded machine, whose homes train slowly), not at the silent home's timeout
    assert deadline <= rows[0]["virtual_time"] < 30.0


def test_no_round_is_dispatched_after_the_last_update():
    """FedAvg: one group, one round per update; stopping dispatches nothing that is never applied."""
    config = LoopConfig(strategy="fedavg", max_concurrent=6, max_updates=3, train=TRAIN)
    loop, transport = make_loop(config)
    assert len(loop.run()) == 3
    assert loop.stop_reason == "max_updates"
    assert transport.tasks_run == 3 * 6


def test_time_to_target_is_recorded_without_stopping_when_asked():
    config = LoopConfig(num_groups=2, homes_per_round=3, max_updates=12, train=TRAIN, target_accuracy=0.2,
                        stop_at_target=False)
    loop, _ = make_loop(config)
    rows = loop.run()
    assert len(rows) == 12 and loop.stop_reason == "max_updates"
    assert loop.summary()["updates_to_target"] is not None and loop.summary()["updates_to_target"] < 12


def test_rt_scale_multiplies_the_derived_threshold():
    loops = [make_loop(LoopConfig(max_updates=1, rt_scale=scale, train=TRAIN))[0] for scale in (1.0, 2.5)]
    for loop in loops:
        loop.profile()
    assert loops[1].rt == pytest.approx(2.5 * loops[0].rt)
    with pytest.raises(UserError, match="rt_scale"):
        LoopConfig(rt_scale=0.0)
    with pytest.raises(UserError, match="latency_units must be one of rt, seconds"):
        LoopConfig(latency_units="minutes")


@pytest.mark.parametrize("limit", ["updates", "virtual_time"])
def test_the_progress_bar_shows_updates_and_virtual_time(capsys, limit):
    """A time-limited run counts virtual seconds (and shows updates), an update-limited one the reverse."""
    if limit == "updates":
        config = LoopConfig(num_groups=2, homes_per_round=2, max_updates=4, train=TRAIN)
    else:
        config = LoopConfig(num_groups=2, homes_per_round=2, max_updates=1000, max_virtual_time_s=15.0, train=TRAIN)
    loop, _ = make_loop(config)
    loop.progress = True
    rows = loop.run()
    shown = capsys.readouterr().err.splitlines()[-1].split("\r")[-1]
    assert shown.startswith("ecofl")
    if limit == "updates":
        assert "4/4" in shown and f"t={loop.clock.now():.0f}s" in shown
    else:
        assert "15/15 virtual s" in shown and f"updates={len(rows)}" in shown


def test_a_stopped_transport_ends_the_run_with_what_was_applied_written(tmp_path):
    """Ctrl-C while waiting for homes: the updates so far are evaluated and written, the reason says so."""
    config = LoopConfig(num_groups=2, homes_per_round=2, max_updates=50, eval_every=100, train=TRAIN)
    loop, transport = make_loop(config, out_dir=tmp_path)
    train, calls = transport.train, []

    def stopping_train(tasks):
        calls.append(len(tasks))
        if len(calls) == 5:
            raise RunStopped("Ctrl-C")
        return train(tasks)

    transport.train = stopping_train
    rows = loop.run()
    assert loop.stop_reason == STOPPED and 0 < len(rows) < 50
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == STOPPED and summary["updates"] == len(rows)
    assert summary["final_accuracy"] == rows[-1]["accuracy"] is not None
    assert len(json.loads((tmp_path / "metrics.json").read_text())) == len(rows)
