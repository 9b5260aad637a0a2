"""Pipelined inference: the stream cost model, inference memory, and the planners' inference objective."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ecofl.devices import DeviceSpec, HomePool
from ecofl.errors import UserError
from ecofl.pipeline.cost import simulate
from ecofl.pipeline.memory_model import memory_per_stage, stage_memory_bytes
from ecofl.pipeline.plan import STREAM_IN_FLIGHT, Plan, StagePlan, plan_schedule
from ecofl.pipeline.planners import PLANNERS, make_plan
from ecofl.pipeline.planners.chain import chain_bottleneck
from ecofl.pipeline.planners.tables import stage_tables
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.stream import simulate_stream, stream_memory_per_stage, stream_stage_memory_bytes
from pipeline_kit import instances

sys.path.insert(0, str(Path(__file__).parent))

MB = 1e6


def linear_profile(forward_s: list[float], activation: list[int], stash: list[int] | None = None,
                   weights: list[int] | None = None, input_bytes: int = 1000) -> ModelProfile:
    """Per-sample forward times (linear in batch size) and integer byte counts, chosen by the test."""
    n = len(forward_s)
    stash = stash or [0] * n
    weights = weights or [10_000] * n
    return ModelProfile(
        model="linear", layer_names=tuple(f"l{i}" for i in range(n)), batch_sizes=(1,),
        forward_s=np.array(forward_s, dtype=float)[:, None], backward_s=2 * np.array(forward_s, dtype=float)[:, None],
        activation_bytes=np.array(activation, dtype=float), gradient_bytes=np.array(activation, dtype=float),
        stash_bytes=np.array(stash, dtype=float), weight_bytes=np.array(weights, dtype=float),
        optimizer_bytes=np.array(weights, dtype=float), flops=np.ones(n), input_bytes=input_bytes,
    )


def pool_of(*devices: tuple[float, float], memory: int = 1 << 30) -> HomePool:
    """Devices (speed, link bytes/s); links between two devices are the slower one's."""
    return HomePool("test", tuple(DeviceSpec(f"d{i}", speed, memory, link) for i, (speed, link) in enumerate(devices)))


def chain(*stages: tuple[int, int, int], micro_batch: int = 2, count: int = 12, hold: int = STREAM_IN_FLIGHT) -> Plan:
    """A stream plan of single-device stages ``(device, first layer, last layer)``."""
    return Plan("test", tuple(StagePlan((a, b), (d,), (micro_batch,), hold) for d, a, b in stages),
                micro_batch, count, schedule="stream")


def test_inference_memory_is_weights_plus_in_flight_activations():
    profile = linear_profile([0.1] * 4, activation=[400, 300, 200, 100], stash=[50, 900, 20, 10],
                             weights=[1000, 2000, 3000, 4000])
    # layers 1..2 with 5 samples and 3 held: W + y (K (x_in + x_out) + max(stash + out))
    expected = (2000 + 3000) + 5 * (3 * (400 + 200) + max(900 + 300, 20 + 200))
    assert stream_stage_memory_bytes(profile, (1, 2), 5, 3) == expected
    assert stream_stage_memory_bytes(profile, (0, 0), 1, 1) == 1000 + (1000 + 400) + 50 + 400  # the model's input
    heavier = replace(profile, optimizer_bytes=profile.optimizer_bytes * 100,
                      gradient_bytes=profile.gradient_bytes * 100)
    assert stream_stage_memory_bytes(heavier, (1, 2), 5, 3) == expected  # no optimizer state, no gradients
    assert expected < stage_memory_bytes(profile, (1, 2), 5, 3)  # training keeps grads, optimizer state, stashes
    tables = stage_tables(profile, 5, "inference")  # the planners count the same bytes
    assert tables.stage_memory(1, 3, 3, 5) == expected
    assert np.isclose(tables.memory_span(3, 5)[1, 3], expected)


def test_inference_tables_are_forward_times_and_activation_transfers():
    profile = linear_profile([0.1, 0.2, 0.3], activation=[40, 30, 20], input_bytes=50)
    training, inference = stage_tables(profile, 4), stage_tables(profile, 4, "inference")
    assert np.allclose(inference.compute, [0, 0.4, 1.2, 2.4]) and np.allclose(training.compute, 3 * inference.compute)
    assert list(inference.cut_bytes) == [0, 40, 30, 0] and list(training.cut_bytes) == [0, 70, 50, 0]
    assert (inference.input_bytes, inference.output_bytes) == (50, 20)
    assert (training.input_bytes, training.output_bytes) == (0, 0)
    assert inference.schedule == "stream" and inference.in_flight_target(5, 0) == STREAM_IN_FLIGHT


def test_a_chain_streams_at_its_bottleneck_with_three_held():
    profile = linear_profile([0.1, 0.3, 0.2], activation=[2000, 500, 10])
    pool = pool_of((1.0, 10_000), (1.0, 10_000), (1.0, 10_000))
    plan = chain((0, 0, 0), (1, 1, 1), (2, 2, 2), micro_batch=2, count=24)
    cost = simulate_stream(plan, profile, pool)
    # forwards 0.2, 0.6, 0.4 s; transfers 0.4 s (4000 B), 0.1 s, and 0.002 s of logits back to the portal
    assert np.isclose(cost.period_s, 0.6) and np.isclose(cost.throughput, 2 / 0.6)
    assert np.isclose(cost.first_latency_s, 0.2 + 0.4 + 0.6 + 0.1 + 0.4 + 0.002)
    assert cost.latency_s >= cost.first_latency_s - 1e-12  # a full pipeline queues before its bottleneck
    assert np.allclose(cost.busy_fraction, [0.2 / 0.6, 1.0, 0.4 / 0.6])
    assert np.allclose(cost.stage_send_s, [0.4, 0.1, 0.002])
    tables = stage_tables(profile, 2, "inference")
    assert np.isclose(chain_bottleneck(tables, pool, [0, 1, 2], [0, 1, 2, 3]), cost.period_s)
    assert cost.stream_throughput < cost.throughput  # fill and drain
    assert cost.num_micro_batches == 24 and cost.stream_s > 23 * 0.6


def test_each_forward_pays_the_runtimes_overhead_per_operation_and_per_byte_at_its_devices_speed():
    """Hand-computed: device 1 (speed 0.5) receives 2 x 2000 B and sends 2 x 500 B per micro-batch; the
    portal's own stage receives nothing (it holds the inputs) and sends 2 x 2000 B; the last stage on device 2
    sends its 2 x 10 B of logits back to the portal."""
    profile = linear_profile([0.1, 0.3, 0.2], activation=[2000, 500, 10])
    pool = pool_of((1.0, 1e12), (0.5, 1e12), (1.0, 1e12))
    plan = chain((0, 0, 0), (1, 1, 1), (2, 2, 2), micro_batch=2, count=24)
    plain = simulate_stream(plan, profile, pool)
    cost = simulate_stream(plan, profile, pool, operation_overhead_s=0.01, byte_overhead_s=1e-5)
    added = np.array(cost.stage_forward_s) - np.array(plain.stage_forward_s)
    np.testing.assert_allclose(added, [0.01 + 1e-5 * 4000, (0.01 + 1e-5 * 5000) / 0.5, 0.01 + 1e-5 * 1020])
    assert np.isclose(cost.period_s, max(cost.stage_forward_s))  # links this fast: the slowest forward
    assert cost.throughput < plain.throughput


def test_holding_one_micro_batch_serialises_receive_forward_and_send():
    profile = linear_profile([0.2, 0.2], activation=[2000, 10])
    pool = pool_of((1.0, 10_000), (1.0, 10_000))
    overlapped = simulate_stream(chain((0, 0, 0), (1, 1, 1), count=20), profile, pool)
    serial = simulate_stream(chain((0, 0, 0), (1, 1, 1), count=20, hold=1), profile, pool)
    assert np.isclose(overlapped.period_s, 0.4)  # forward 0.4 s, transfer 0.4 s, overlapped
    assert serial.period_s > 1.5 * overlapped.period_s  # a held micro-batch blocks the next transfer in
    assert serial.stage_memory_bytes[1] < overlapped.stage_memory_bytes[1]


def test_the_portal_sends_inputs_to_a_remote_first_stage_and_gets_results_back():
    profile = linear_profile([0.1, 0.1], activation=[100, 4000], input_bytes=8000)
    pool = pool_of((1.0, 10_000), (1.0, 10_000), (1.0, 10_000))
    cost = simulate_stream(chain((1, 0, 0), (2, 1, 1), micro_batch=1, count=16), profile, pool)
    portal = [e for e in cost.timeline if e.device == 0]
    assert {e.kind for e in portal} == {"send", "recv"} and {e.stage for e in portal} == {-1}
    assert np.isclose(cost.period_s, 0.8)  # the input link (8000 B at 10 kB/s) is the bottleneck
    assert np.isclose(cost.first_latency_s, 0.8 + 0.1 + 0.01 + 0.1 + 0.4)


def test_a_replicated_stage_splits_each_micro_batch():
    profile = linear_profile([0.1, 0.1], activation=[100, 10])
    pool = pool_of((1.0, MB), (1.0, MB), (2.0, MB))
    stages = (StagePlan((0, 0), (0,), (4,), 3), StagePlan((1, 1), (1, 2), (1, 3), 3))
    cost = simulate_stream(Plan("test", stages, 4, 10, schedule="stream"), profile, pool)
    forwards = {d: {round(e.end - e.start, 9) for e in cost.timeline if e.kind == "F" and e.device == d}
                for d in (0, 1, 2)}
    assert forwards == {0: {0.4}, 1: {0.1}, 2: {0.15}}  # device 2 computes 3 samples at speed 2
    assert cost.stage_memory_bytes[1] == stream_stage_memory_bytes(profile, (1, 1), 3, 3)


@pytest.mark.parametrize("hold", [1, 2, 3])
def test_a_device_never_holds_more_than_k_micro_batches_when_a_replicated_stage_feeds_a_slow_portal(hold):
    """Three devices of stage 0 feed the portal's slow last stage: their transfers queue for its room."""
    profile = linear_profile([0.01, 0.3], activation=[500, 10], input_bytes=200)
    pool = pool_of((1.0, MB), (1.0, 50_000), (2.0, 50_000), (0.5, 50_000))
    stages = (StagePlan((0, 0), (1, 2, 3), (2, 1, 1), hold), StagePlan((1, 1), (0,), (4,), hold))
    cost = simulate_stream(Plan("test", stages, 4, 24, schedule="stream"), profile, pool)
    if hold > 1:
        assert np.isclose(cost.period_s, 4 * 0.3)  # the portal's forward is the bottleneck
    else:  # the portal takes the next micro-batch only once it is done with the last: the transfer in adds
        assert cost.period_s > 4 * 0.3 + 0.005
    for device in (0, 1, 2, 3):
        held = {}  # micro-batch -> [taken, left] on this device
        for e in cost.timeline:
            if e.device == device and e.stage >= 0:
                span = held.setdefault(e.micro_batch, [np.inf, -np.inf])
                if e.kind in ("recv", "F"):  # taken when its transfer in (or, on the portal, its forward) starts
                    span[0] = min(span[0], e.start)
                span[1] = max(span[1], e.end)  # left when its forward and its transfers out are done
        assert sorted(held) == list(range(24))
        for m, (taken, _) in held.items():
            at_once = sum(1 for a, b in held.values() if a <= taken + 1e-12 and b > taken + 1e-12)
            assert at_once <= hold, (device, m, at_once)


def test_the_stream_has_no_backward_and_every_micro_batch_passes_every_stage():
    profile = linear_profile([0.1] * 4, activation=[100] * 4)
    pool = pool_of((1.0, MB), (0.5, MB), (2.0, MB))
    cost = simulate_stream(chain((2, 0, 1), (0, 2, 2), (1, 3, 3)), profile, pool, num_micro_batches=9)
    assert {e.kind for e in cost.timeline} == {"F", "send", "recv"}
    for device in (0, 1, 2):
        assert sorted(e.micro_batch for e in cost.timeline if e.kind == "F" and e.device == device) == list(range(9))
    for device in (0, 1, 2):  # a device never overlaps its own forwards
        spans = sorted((e.start, e.end) for e in cost.timeline if e.kind == "F" and e.device == device)
        assert all(b[0] >= a[1] - 1e-12 for a, b in zip(spans, spans[1:]))


def test_training_and_stream_plans_are_not_mixed_up():
    profile = linear_profile([0.1, 0.1], activation=[100, 10])
    pool = pool_of((1.0, MB), (1.0, MB))
    stream = chain((0, 0, 0), (1, 1, 1))
    training = replace(stream, schedule="1f1b")
    for call in (lambda: simulate(stream, profile, pool), lambda: plan_schedule(stream),
                 lambda: memory_per_stage(stream, profile)):
        with pytest.raises(ValueError, match="inference"):
            call()
    with pytest.raises(ValueError, match="objective='inference'"):
        simulate_stream(training, profile, pool)
    with pytest.raises(UserError, match="training, inference"):
        make_plan("pipeedge", profile, pool, 8, objective="serving")


@pytest.mark.parametrize("planner", list(PLANNERS))
def test_every_planner_plans_a_stream_within_memory(planner):
    planned = 0
    for rng, profile, pool in instances(7, 15, layers=(5, 8), devices=(2, 4)):
        try:
            plan = make_plan(planner, profile, pool, 48, objective="inference")
        except UserError:
            assert planner in ("even", "dp")
            continue
        planned += 1
        assert plan.schedule == "stream" and plan.objective == "inference" and plan.batch_size == 48
        cost = simulate_stream(plan, profile, pool)
        assert cost.throughput > 0 and cost.latency_s > 0
        for stage, peak in zip(plan.stages, stream_memory_per_stage(plan, profile)):
            assert 1 <= stage.in_flight <= STREAM_IN_FLIGHT
            for device, share in zip(stage.devices, stage.shares):
                assert stream_stage_memory_bytes(profile, stage.layers, share, stage.in_flight) <= peak
                assert peak <= pool.devices[device].memory_bytes or len(stage.devices) > 1
                assert cost.device_memory_bytes[device] <= pool.devices[device].memory_bytes
    assert planned >= (2 if planner == "dp" else 5)


@pytest.mark.parametrize("planner", ["ecofl", "pipeedge", "even"])
def test_a_chain_plans_bottleneck_is_the_simulated_period(planner):
    """The DP's objective (PipeEdge eq. 3 plus the portal's transfers) is what the stream settles to."""
    compared = 0
    for rng, profile, pool in instances(13, 25, layers=(3, 8), devices=(1, 5)):
        try:
            plan = make_plan(planner, profile, pool, int(rng.choice([8, 24, 48])), objective="inference")
        except UserError:
            continue
        if any(stage.in_flight < STREAM_IN_FLIGHT for stage in plan.stages):
            continue
        compared += 1
        tables = stage_tables(profile, plan.micro_batch, "inference")
        devices = [stage.devices[0] for stage in plan.stages]
        cuts = [stage.layers[0] for stage in plan.stages] + [profile.num_layers]
        assert np.isclose(simulate_stream(plan, profile, pool).period_s, chain_bottleneck(tables, pool, devices, cuts))
    assert compared >= 15


@pytest.mark.parametrize("planner", ["ecofl", "hpp", "pipeedge"])
def test_a_short_stream_is_never_faster_than_its_slowest_device_or_link(planner):
    """Every device computes its share of every micro-batch and every channel carries it: a period below
    the slowest of them would be the fill of a short stream mistaken for its steady state."""
    for rng, profile, pool in instances(17, 30, layers=(3, 8), devices=(2, 5)):
        try:
            plan = make_plan(planner, profile, pool, int(rng.choice([8, 24, 48])), objective="inference")
        except UserError:
            continue
        for count in (2, 3, 5, 8):
            cost = simulate_stream(plan, profile, pool, num_micro_batches=count)
            slowest = max(max(cost.stage_forward_s), max(cost.stage_send_s))
            assert cost.period_s >= slowest
            assert cost.throughput == pytest.approx(plan.micro_batch / cost.period_s)


@pytest.mark.parametrize("slow", ["compute", "link"])
def test_pipeedge_leaves_out_a_device_that_would_lower_throughput(slow):
    """PipeEdge §III-B: choosing the subset beats using every device (ecofl: best order; even: pool order)."""
    profile = linear_profile([0.01] * 8, activation=[2000] * 8, input_bytes=2000)
    fast = (1.0, 10 * MB)
    slow_device = (0.02, 10 * MB) if slow == "compute" else (1.0, 0.02 * MB)
    pool = pool_of(fast, slow_device, fast, fast)
    inference = {name: make_plan(name, profile, pool, 64, objective="inference")
                 for name in ("pipeedge", "ecofl", "even")}
    chosen = [stage.devices[0] for stage in inference["pipeedge"].stages]
    assert 1 not in chosen and len(chosen) == 3
    throughput = {name: simulate_stream(plan, profile, pool).throughput for name, plan in inference.items()}
    assert throughput["pipeedge"] > 1.5 * throughput["ecofl"] > 0
    assert throughput["ecofl"] >= throughput["even"]
    # the same pool under the training objective: PipeEdge leaves the device out there too
    assert 1 not in {stage.devices[0] for stage in make_plan("pipeedge", profile, pool, 64).stages}


def test_a_model_too_big_to_train_on_a_device_can_stream_through_it():
    """No gradients, optimizer state or stashes for backward: inference needs the weights and a few activations."""
    profile = linear_profile([0.01] * 4, activation=[1000] * 4, stash=[20_000] * 4, weights=[400_000] * 4)
    device = pool_of((1.0, MB), memory=3_000_000)
    with pytest.raises(UserError, match="bytes short"):
        make_plan("pipeedge", profile, device, 8)  # 2 x 1.6 MB of weights and gradients + 1.6 MB optimizer state
    plan = make_plan("pipeedge", profile, device, 8, objective="inference")
    assert plan.stages[0].in_flight == STREAM_IN_FLIGHT
    assert stream_memory_per_stage(plan, profile)[0] <= 3_000_000


def test_stream_gantt_writes_a_png(tmp_path):
    from ecofl.pipeline.gantt import plot_gantt

    profile = linear_profile([0.1, 0.1], activation=[100, 10])
    cost = simulate_stream(chain((0, 0, 0), (1, 1, 1)), profile, pool_of((1.0, MB), (1.0, MB)))
    plot_gantt(cost.timeline, tmp_path / "stream.png", title="stream")
    assert (tmp_path / "stream.png").stat().st_size > 0
