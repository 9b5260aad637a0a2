"""The sync-round cost model: trapezoid, bubbles, memory, links, flush."""

from dataclasses import replace

import pytest

from ecofl.devices import MBPS, DeviceSpec, HomePool
from ecofl.pipeline.cost import Background, simulate
from ecofl.pipeline.memory_model import memory_per_stage, stage_memory_bytes
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.schedule import ActionKind, default_in_flight
from pipeline_kit import T_B, T_F, synthetic_profile


def uniform_pool(n: int, mbps: float = 100.0, speed: float = 1.0) -> HomePool:
    return HomePool("test", tuple(DeviceSpec(f"d{i}", speed, 1 << 32, mbps * MBPS) for i in range(n)))


def chain_plan(stages: int, micro_batch: int, micro_batches: int, schedule: str = "1f1b", in_flight=None) -> Plan:
    in_flight = in_flight or default_in_flight(stages)
    return Plan(
        planner="test",
        stages=tuple(StagePlan((s, s), (s,), (micro_batch,), in_flight[s]) for s in range(stages)),
        micro_batch=micro_batch,
        num_micro_batches=micro_batches,
        schedule=schedule,
    )


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 8), (6, 16)])
def test_balanced_pipeline_without_communication_is_the_trapezoid(schedule, stages, micro_batches):
    cost = simulate(chain_plan(stages, 4, micro_batches, schedule), synthetic_profile(stages), uniform_pool(stages))
    t_f, t_b = 4 * T_F, 4 * T_B
    assert cost.sync_round_s == pytest.approx((micro_batches + stages - 1) * (t_f + t_b))
    assert cost.ssb_s == pytest.approx((stages - 1) * (t_f + t_b))  # Eco-FL eq. 2
    assert cost.sync_round_s == pytest.approx(micro_batches * (t_f + t_b) + cost.ssb_s)
    assert max(cost.ddb_s) == pytest.approx(0.0, abs=1e-9)
    assert cost.throughput == pytest.approx(4 * micro_batches / cost.sync_round_s)


def test_too_few_in_flight_makes_dependency_bubbles():
    profile, pool = synthetic_profile(3), uniform_pool(3)
    tight = simulate(chain_plan(3, 4, 8, in_flight=[1, 1, 1]), profile, pool)
    loose = simulate(chain_plan(3, 4, 8), profile, pool)
    assert tight.sync_round_s > loose.sync_round_s
    assert max(tight.ddb_s) > 0


def test_1f1b_peak_memory_at_most_gpipe_and_lower_once_m_exceeds_k0():
    profile, pool = synthetic_profile(4), uniform_pool(4)
    k0 = default_in_flight(4)[0]
    for micro_batches in (1, 4, k0, k0 + 1, 16):
        ours = simulate(chain_plan(4, 2, micro_batches), profile, pool).stage_memory_bytes
        theirs = simulate(chain_plan(4, 2, micro_batches, "gpipe"), profile, pool).stage_memory_bytes
        assert all(a <= b for a, b in zip(ours, theirs))
        if micro_batches > k0:
            assert all(a < b for a, b in zip(ours, theirs))


def test_memory_per_stage_matches_simulation_and_eq3():
    profile, pool = synthetic_profile(3), uniform_pool(3)
    plan = chain_plan(3, 8, 16)
    assert memory_per_stage(plan, profile) == list(simulate(plan, profile, pool).stage_memory_bytes)
    # stage 0 holds K_0 = 5 forward tasks: MOD (2 x weights) + OPT + 5 x 1000 B x 8 samples
    assert memory_per_stage(plan, profile)[0] == 2 * 10**6 + 10**6 + 5 * 1000 * 8
    assert stage_memory_bytes(profile, (0, 2), 8, 1) == 3 * (3 * 10**6) + 3 * 1000 * 8


def test_slower_link_raises_sync_round():
    profile = synthetic_profile(3, activation=200_000.0)
    plan = chain_plan(3, 8, 8)
    fast = simulate(plan, profile, uniform_pool(3, mbps=1000)).sync_round_s
    slow = simulate(plan, profile, uniform_pool(3, mbps=10)).sync_round_s
    assert slow > fast
    # at 10 Mbps each transfer (1.6 MB, 1.28 s) is slower than a stage's compute: comm-bound
    assert slow > 8 * 1.6e6 / (10 * MBPS)


def test_portal_sends_inputs_when_stage0_is_elsewhere():
    profile = synthetic_profile(2, activation=100_000.0)
    pool = uniform_pool(3)
    on_portal = Plan("t", (StagePlan((0, 0), (0,), (4,), 3), StagePlan((1, 1), (1,), (4,), 1)), 4, 4)
    off_portal = Plan("t", (StagePlan((0, 0), (2,), (4,), 3), StagePlan((1, 1), (1,), (4,), 1)), 4, 4)
    near, far = simulate(on_portal, profile, pool), simulate(off_portal, profile, pool)
    first_input = 4 * 100_000 / (100 * MBPS)
    assert far.sync_round_s == pytest.approx(near.sync_round_s + first_input)
    assert any(e.device == 0 and e.stage == -1 and e.kind == "send" for e in far.timeline)


def test_replicated_stage_all_reduces_and_splits_samples():
    weight = 4e6
    profile = synthetic_profile(2, weight=weight, step=0.001)
    pool = uniform_pool(3)
    plan = Plan("t", (StagePlan((0, 0), (0, 1), (2, 6), 3), StagePlan((1, 1), (2,), (8,), 1)), 8, 2)
    cost = simulate(plan, profile, pool)
    allreduce = [e for e in cost.timeline if e.kind == "allreduce"]
    assert {e.device for e in allreduce} == {0, 1}
    assert allreduce[0].end - allreduce[0].start == pytest.approx(2 * 1 / 2 * weight / (100 * MBPS))
    assert cost.flush_s[0] == pytest.approx(allreduce[0].end - allreduce[0].start + 0.001)
    forward = {e.device: e.end - e.start for e in cost.timeline if e.kind == "F" and e.micro_batch == 0}
    assert forward[1] == pytest.approx(3 * forward[0])  # 6 samples vs 2
    # the bigger share holds more activations
    assert cost.device_memory_bytes[1] > cost.device_memory_bytes[0]
    assert cost.stage_memory_bytes[0] == memory_per_stage(plan, profile)[0]


def test_a_ring_charges_its_messages_at_the_slowest_replicas_speed():
    """Each of the 4(n-1) messages a replica sends and receives costs the runtime's time per operation at the
    group's slowest speed, beside the bytes' time on the link."""
    weight, overhead = 4e6, 0.001
    profile = synthetic_profile(2, weight=weight, step=0.001)
    pool = HomePool("p", (DeviceSpec("fast", 1.0, 1 << 30, 100 * MBPS), DeviceSpec("slow", 0.25, 1 << 30, 100 * MBPS),
                          DeviceSpec("next", 1.0, 1 << 30, 100 * MBPS)))
    plan = Plan("t", (StagePlan((0, 0), (0, 1), (4, 4), 3), StagePlan((1, 1), (2,), (8,), 1)), 8, 2)
    timeline = simulate(plan, profile, pool, operation_overhead_s=overhead).timeline
    allreduce = {e.device: e.end - e.start for e in timeline if e.kind == "allreduce"}
    assert allreduce == pytest.approx({d: weight / (100 * MBPS) + 4 * overhead / 0.25 for d in (0, 1)})
    without = simulate(plan, profile, pool).timeline
    assert [e.end - e.start for e in without if e.kind == "allreduce"] == pytest.approx([weight / (100 * MBPS)] * 2)


def test_a_confined_replica_handles_the_rings_messages_at_its_quota_not_its_training_speed():
    """A confined device that trains below its quota (one sample a call) still sends messages at its quota's
    pace: the ring's messages are charged at its cores where the pool knows them."""
    weight, overhead = 4e6, 0.001
    profile = synthetic_profile(2, weight=weight, step=0.001)
    slow = DeviceSpec("slow", 0.25, 1 << 30, 100 * MBPS, cores=0.5)
    fast, after = (DeviceSpec(name, 1.0, 1 << 30, 100 * MBPS) for name in ("fast", "next"))
    pool = HomePool("p", (fast, slow, after))
    plan = Plan("t", (StagePlan((0, 0), (0, 1), (4, 4), 3), StagePlan((1, 1), (2,), (8,), 1)), 8, 2)
    timeline = simulate(plan, profile, pool, operation_overhead_s=overhead).timeline
    allreduce = [e.end - e.start for e in timeline if e.kind == "allreduce"]
    assert allreduce == pytest.approx([weight / (100 * MBPS) + 4 * overhead / 0.5] * 2)
    assert slow.cpu_speed == 0.5 and replace(slow, cores=None).cpu_speed == 0.25


def test_devices_never_overlap_their_own_compute():
    profile = synthetic_profile(6, activation=50_000.0)
    cost = simulate(chain_plan(6, 4, 16), profile, uniform_pool(6))
    for device in range(6):
        spans = sorted((e.start, e.end) for e in cost.timeline if e.device == device and e.kind in "FB")
        assert len(spans) == 32
        assert all(a_end <= b_start + 1e-12 for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def test_a_stage_holds_no_more_than_its_predecessors():
    profile, pool = synthetic_profile(3), uniform_pool(3)
    plan = chain_plan(3, 2, 6, in_flight=[1, 3, 1])
    simulated = simulate(plan, profile, pool).stage_memory_bytes
    assert list(simulated) == memory_per_stage(plan, profile)
    assert simulated[1] == stage_memory_bytes(profile, (1, 1), 2, 1)


def test_plan_must_fit_profile_and_pool():
    with pytest.raises(ValueError, match="layers"):
        simulate(chain_plan(3, 2, 2), synthetic_profile(4), uniform_pool(3))
    with pytest.raises(ValueError, match="devices"):
        simulate(chain_plan(3, 2, 2), synthetic_profile(3), uniform_pool(2))


@pytest.mark.parametrize("schedule, in_flight", [("1f1b", None), ("gpipe", None), ("async-1f1b", [1, 1, 1])])
def test_a_core_per_device_changes_nothing(schedule, in_flight):
    """Processes of one machine with a core each run as if on machines of their own (async steps included)."""
    profile, pool = synthetic_profile(3, step=0.001), uniform_pool(3)
    plan = chain_plan(3, 4, 8, schedule, in_flight)
    alone = simulate(plan, profile, pool)
    enough = simulate(plan, profile, pool, cores=3)
    assert enough.sync_round_s == pytest.approx(alone.sync_round_s)
    assert sorted(enough.timeline) == sorted(alone.timeline)


@pytest.mark.parametrize("schedule, in_flight", [("1f1b", None), ("async-1f1b", [1, 1, 1])])
def test_every_optimizer_step_costs_the_runtimes_time_per_operation(schedule, in_flight):
    """The flush's steps and asynchronous 1F1B's step after every backward alike: the profile's step of the
    stage's layer plus the time per operation, at the device's speed (uniform_pool: speed 1)."""
    step, overhead = 0.001, 0.003
    plan = chain_plan(3, 4, 8, schedule, in_flight)
    timeline = simulate(plan, synthetic_profile(3, step=step), uniform_pool(3), operation_overhead_s=overhead).timeline
    steps = [e.end - e.start for e in timeline if e.kind == "step"]
    assert len(steps) == (3 if schedule == "1f1b" else 3 * 8)
    assert steps == pytest.approx([step + overhead] * len(steps))


def test_shared_cores_share_what_does_not_fit():
    """Devices that are processes of one machine (a host-speed run) share its cores."""
    profile, pool = synthetic_profile(3), uniform_pool(3)
    plan = chain_plan(3, 4, 8)
    alone = simulate(plan, profile, pool)
    one = simulate(plan, profile, pool, cores=1)
    work = sum(e.end - e.start for e in alone.timeline if e.kind in ("F", "B"))
    assert one.sync_round_s == pytest.approx(work)  # one core never idles while an operation is ready
    two = simulate(plan, profile, pool, cores=2)
    assert alone.sync_round_s < two.sync_round_s < one.sync_round_s
    assert two.sync_round_s >= work / 2 - 1e-9  # no more than two cores' worth of work per second
    with pytest.raises(ValueError, match="cores"):
        simulate(plan, profile, pool, cores=0)


@pytest.mark.parametrize("cores, stretch", [(1, 3.0), (2, 1.5), (3, 1.0)])
def test_operations_running_together_share_the_cores_equally(cores, stretch):
    """Processor sharing: three replicas compute at once, each at min(1, cores / 3) of a core."""
    plan = Plan("test", (StagePlan((0, 0), (0, 1, 2), (4, 4, 4), 1),), micro_batch=12, num_micro_batches=2)
    cost = simulate(plan, synthetic_profile(1), uniform_pool(3), cores=cores)
    for event in cost.timeline:
        if event.kind in ("F", "B"):
            assert event.end - event.start == pytest.approx(stretch * 4 * (T_F if event.kind == "F" else T_B))


@pytest.mark.parametrize("stages,micro_batches", [(1, 4), (3, 8)])
def test_operation_overhead_lengthens_every_forward_and_backward(stages, micro_batches):
    """The runtime's own time per operation (host runs): the trapezoid with t_f + o and t_b + o, then the first
    stage's optimizer step, an operation too (free in the profile: o)."""
    overhead = 0.003
    cost = simulate(chain_plan(stages, 4, micro_batches), synthetic_profile(stages), uniform_pool(stages),
                    operation_overhead_s=overhead)
    t_f, t_b = 4 * T_F + overhead, 4 * T_B + overhead
    assert cost.sync_round_s == pytest.approx((micro_batches + stages - 1) * (t_f + t_b) + overhead)
    steps = [e.end - e.start for e in cost.timeline if e.kind == "step"]
    assert steps == pytest.approx([overhead] * stages)
    with pytest.raises(ValueError, match="negative"):
        simulate(chain_plan(stages, 4, micro_batches), synthetic_profile(stages), uniform_pool(stages),
                 operation_overhead_s=-1.0)


def test_byte_overhead_charges_each_pass_the_bytes_it_sends_or_receives_at_the_devices_speed():
    """Two stages on half-speed devices, links too fast to matter: each forward moves 4 samples of activations
    (stage 0 sends them, stage 1 receives them) and each backward 4 samples of gradients, at c per byte."""
    byte_s, activation, speed, micro_batches = 1e-8, 1e5, 0.5, 6
    plan, profile = chain_plan(2, 4, micro_batches), synthetic_profile(2, activation=activation)
    cost = simulate(plan, profile, uniform_pool(2, mbps=1e9, speed=speed), byte_overhead_s=byte_s)
    moved = byte_s * activation * 4 / speed
    t_f, t_b = 4 * T_F / speed + moved, 4 * T_B / speed + moved
    assert cost.sync_round_s == pytest.approx((micro_batches + 1) * (t_f + t_b), rel=1e-4)
    without = simulate(plan, profile, uniform_pool(2, mbps=1e9, speed=speed))
    assert cost.sync_round_s > without.sync_round_s
    with pytest.raises(ValueError, match="negative"):
        simulate(plan, profile, uniform_pool(2), byte_overhead_s=-1e-9)


def test_background_work_fills_a_devices_wait_for_its_first_input_as_its_link_allows_then_its_passes():
    """Fault tolerance's copies (``background``): a device does them first while it waits for its first input,
    as far as its link has brought their bytes; the rest is spread over its 2M passes. On the bottleneck device
    they lengthen the round; on a device with slack they only fill it."""
    micro_batches = 6
    plan, profile = chain_plan(2, 4, micro_batches), synthetic_profile(2)
    link = 1e9  # bytes/s
    pool = HomePool("x", (DeviceSpec("slow", 0.5, 4e9, link), DeviceSpec("fast", 2.0, 4e9, link)))
    plain = simulate(plan, profile, pool)
    waits = min(e.start for e in plain.timeline if e.device == 1 and e.kind == ActionKind.FORWARD)
    assert waits > 0  # device 1 waits for stage 0's first forward
    extra = 0.6
    slowed = simulate(plan, profile, pool, background={0: Background(1e6, extra)})  # starts at once: none absorbed
    assert slowed.device_busy_s[0] == pytest.approx(plain.device_busy_s[0] + extra)
    assert slowed.sync_round_s > plain.sync_round_s + 0.5 * extra  # device 0 computes most of the round
    few_bytes = link * waits / 2  # all of them arrive within the wait
    absorbed = simulate(plan, profile, pool, background={1: Background(few_bytes, 0.9 * waits)})
    assert absorbed.sync_round_s == pytest.approx(plain.sync_round_s)  # done before its first pass
    many_bytes = 4 * link * waits  # a quarter of them arrive within the wait: a quarter of the work is done there
    late = simulate(plan, profile, pool, background={1: Background(many_bytes, 0.9 * waits)})
    assert late.device_busy_s[1] == pytest.approx(plain.device_busy_s[1] + 0.75 * 0.9 * waits)
    slack = simulate(plan, profile, pool, background={1: Background(few_bytes, waits + extra)})
    assert slack.device_busy_s[1] == pytest.approx(plain.device_busy_s[1] + extra)
    assert slack.sync_round_s - plain.sync_round_s < 0.25 * extra  # only its fill and drain passes count
    with pytest.raises(ValueError, match="negative"):
        Background(1.0, -1.0)


def test_gantt_writes_a_png(tmp_path):
    from ecofl.pipeline.gantt import plot_gantt

    cost = simulate(chain_plan(3, 4, 4), synthetic_profile(3, activation=50_000.0), uniform_pool(3))
    path = tmp_path / "gantt.png"
    plot_gantt(cost.timeline, path, title="test", device_names={0: "nano"})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="empty"):
        plot_gantt([], tmp_path / "none.png")
