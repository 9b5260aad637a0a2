"""The runtime's pure parts, without processes: topology, wire format, link pacing, memory ledger, prediction."""

from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from ecofl.devices import DeviceSpec, HomePool, host_cores, host_pool
from ecofl.net.links import RoundAborted, Ticket, never_aborted
from ecofl.net.pacing import TokenBucket
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.cost import simulate
from ecofl.pipeline.instructions import device_program
from ecofl.pipeline.plan import Plan, ScheduleKind, StagePlan
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.emulation import MemoryLedger
from ecofl.pipeline.runtime import prediction
from ecofl.pipeline.runtime.copies import Copies
from ecofl.pipeline.runtime.errors import EmulatedOOM
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.hand_off import hand_off_first
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.topology import Peer, WorkerRole, worker_roles
from ecofl.pipeline.schedule import one_f_one_b
from pipeline_kit import PROFILE, THREE_STAGES, WITHOUT_BATCH_NORM, pool


def test_replicated_stages_exchange_overlapping_sample_ranges():
    """Asteroid Fig. 10 with uneven shares: 5+3 samples feed 2+6 samples."""
    pool = HomePool("p", tuple(DeviceSpec(f"d{i}", 1.0, 1 << 30, 1e6 * (i + 1)) for i in range(4)))
    plan = Plan("hand", (StagePlan((0, 1), (0, 1), (5, 3), 3), StagePlan((2, 2), (2, 3), (2, 6), 1)), 8, 4)
    roles = {r.device: r for r in worker_roles(plan, pool, None, sleeps=True)}
    assert [roles[d].rank for d in range(4)] == [0, 1, 2, 3]
    assert (roles[0].lo, roles[0].hi, roles[1].lo, roles[1].hi) == (0, 5, 5, 8)
    assert roles[0].destinations == (Peer(2, 2, 0, 2, 1e6), Peer(3, 3, 2, 5, 1e6))
    assert roles[1].destinations == (Peer(3, 3, 5, 8, 2e6),)
    assert roles[3].sources == (Peer(0, 0, 2, 5, 1e6), Peer(1, 1, 5, 8, 2e6))  # slower end of each path
    assert roles[0].replicas == (0, 1) and roles[3].replicas == (2, 3)
    assert roles[0].input_bps is None and roles[1].input_bps == 1e6  # the portal is device 0
    assert roles[0].allreduce_bps == 1e6
    expected = device_program(one_f_one_b(2, 4, [3, 1])[0], 0, 2, replicated=True)
    assert roles[0].program == expected and roles[0].resident_bound == 3
    assert [i.op for i in expected[-2:]] == ["reduce_grads", "optimizer_step"]
    assert WorkerRole.from_json(roles[3].to_json()) == roles[3]
    assert WorkerRole.from_json(json.loads(json.dumps(roles[3].to_json()))).schedule is ScheduleKind.ONE_F_ONE_B
    assert all(p.bandwidth_bps is None for r in worker_roles(plan, pool, None, sleeps=False) for p in r.destinations)


def test_wire_round_trips_arrays_and_refuses_object_arrays():
    a, b = socket.socketpair()
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7, dtype=np.int64),
              "e": np.zeros((0, 4), dtype=np.float64)}
    send_message(a, {"type": "x", "k": [1, 2]}, arrays)
    header, got = recv_message(b)
    assert header == {"type": "x", "k": [1, 2]}
    for name, array in arrays.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape
        np.testing.assert_array_equal(got[name], array)
    with pytest.raises(TypeError):
        send_message(a, {}, {"o": np.array([object()])})
    a.close(), b.close()


def test_token_bucket_paces_bytes_at_its_rate():
    bucket = TokenBucket(rate_bps=2e6, burst_bytes=1000)
    start = time.time()
    for _ in range(4):
        bucket.consume(100_000)
    assert time.time() - start >= 0.18  # 400 kB at 2 MB/s less the 1 kB burst: never faster than the rate


def test_a_slow_link_bursts_no_more_than_ten_milliseconds_of_its_rate():
    """A 0.2 Mbps link must not let a stream of 5 kB activations through in one 64 kB burst."""
    assert TokenBucket(rate_bps=25_000).burst == 250
    assert TokenBucket(rate_bps=12.5e6).burst == 64 * 1024
    bucket = TokenBucket(rate_bps=25_000)
    start = time.time()
    for _ in range(3):
        bucket.consume(2_500)
    assert time.time() - start >= 0.28  # 7.5 kB at 25 kB/s less the 250 B burst


def test_a_bucket_without_burst_is_a_fifo_link_and_its_wait_can_be_aborted():
    """The stream's input and result links and layer migrations: n bytes take n / rate each, back to back."""
    link = TokenBucket(rate_bps=100_000, burst_bytes=0)
    start = time.monotonic()
    link.consume(10_000)
    link.consume(10_000)
    assert time.monotonic() - start >= 0.19  # 2 x 10 kB at 100 kB/s, never faster
    checks = []

    def abort() -> None:
        checks.append(1)
        if len(checks) == 2:
            raise RoundAborted("the stream ended")

    with pytest.raises(RoundAborted):
        TokenBucket(rate_bps=1_000, burst_bytes=0).consume(100_000, abort)  # 100 s unless aborted
    assert len(checks) == 2


def test_memory_ledger_projects_the_schedule_peak_from_measured_forwards():
    ledger = MemoryLedger("1 (nano)", 1, budget=1000, fixed=100, resident_bound=3, schedule="1f1b", enforce=True)
    ledger.forward(0, 250)  # 100 + 3 x 250 = 850 fits
    ledger.forward(1, 250)
    ledger.backward(0)
    ledger.forward(2, 250)
    assert (ledger.peak_count, ledger.peak_bytes) == (2, 500)
    with pytest.raises(EmulatedOOM, match=r"device 1 \(nano\) \(stage 1, 1f1b\): 3 resident micro-batches"):
        ledger.forward(3, 400)  # 3 x 400 + 100 > 1000
    relaxed = MemoryLedger("0", 0, budget=10, fixed=100, resident_bound=8, schedule="gpipe", enforce=False)
    relaxed.forward(0, 10**6)
    assert relaxed.peak_bytes == 10**6


@pytest.mark.parametrize("mode", ["sleep", "cgroup", "none"])
def test_the_prediction_carries_the_runtimes_overheads_where_devices_compute_for_real(mode, monkeypatch):
    """One prediction for the CLI, the benchmarks and a simulation's pipeline homes (.prediction): the runtime's
    overheads included where nothing sleeps, the devices sharing this host's cores at host speed."""
    overheads = {"operation_overhead_s": 0.004, "byte_overhead_s": 1e-8}  # as if measured on this host
    monkeypatch.setattr(prediction, "runtime_overheads",
                        lambda emulation, cache_dir=None: {} if emulation == "sleep" else overheads)
    devices = pool(3)
    plain = simulate(THREE_STAGES, PROFILE, devices)
    expected = {"sleep": plain, "cgroup": simulate(THREE_STAGES, PROFILE, devices, **overheads),
                "none": simulate(THREE_STAGES, PROFILE, host_pool(devices), cores=host_cores(), **overheads)}[mode]
    predicted = prediction.predict_sync_round(THREE_STAGES, PROFILE, devices, mode)
    assert predicted.sync_round_s == pytest.approx(expected.sync_round_s)
    assert mode == "sleep" or predicted.sync_round_s > plain.sync_round_s



@pytest.mark.parametrize("cores", [0.025, 0.5])
def test_a_device_of_less_than_a_core_computes_on_only_once_its_hand_offs_have_left(cores):
    """Its sender threads share its quota with its passes: the hand-off goes first (docs/pipeline.md)."""
    tickets, left = [Ticket(), Ticket()], []

    def leave() -> None:
        time.sleep(0.2)
        for ticket in tickets:
            left.append(ticket)
            ticket.finish()

    threading.Thread(target=leave).start()
    hand_off_first(CpuPace(cores), tickets, 30.0, never_aborted)
    assert len(left) == 2 and all(t.done.is_set() for t in tickets)


@pytest.mark.parametrize("cores", [None, 1.0, 2.0])
def test_a_device_with_a_core_to_spare_computes_on_while_its_hand_offs_leave(cores):
    tickets = [Ticket(), Ticket()]
    hand_off_first(CpuPace(cores), tickets, 30.0, never_aborted)  # returns although no send has left
    assert not any(t.done.is_set() for t in tickets)


def test_replicas_spare_the_device_busiest_at_the_speeds_known_now():
    """The portal places each sync-round's replicas on the speeds it knows then: device 0 busiest at the speeds
    planned on, the middle stage is backed up on device 2 alone; device 2 re-learned ten times slower, on
    device 0 alone."""
    model, layers = WITHOUT_BATCH_NORM.build()
    home = pool(3)
    layout = PipelineLayout(model, layers, home, THREE_STAGES, PROFILE, sleeps=False, pace_links=False)
    rank_of = {role.device: role.rank for role in layout.roles}

    def backups_of_the_middle_stage(at: HomePool) -> list[int]:
        copies = Copies(control=None, layout=layout, ft=FaultTolerance(), momentum=False, start={})
        return copies.replication(0, at)[1].to

    assert backups_of_the_middle_stage(home) == [rank_of[2]]
    assert backups_of_the_middle_stage(with_speeds(home, {2: home.devices[2].speed / 10})) == [rank_of[0]]
