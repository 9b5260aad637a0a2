"""Failures end at the portal as clear errors within bounded time, leaving no process behind.

A worker that dies mid-round, a device that never joins, and a peer without
the home's secret (plus the handshake itself, both ways, without processes).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import torch

from ecofl.devices import DeviceSpec, HomePool
from ecofl.net.auth import admit_peer, join_home
from ecofl.net.errors import AuthenticationFailed
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime import (
    DeviceUnreachable,
    HomePipeline,
    LayerList,
    WorkerDied,
)
from ecofl.pipeline.runtime.launch import LocalDevices
from helpers import free_ports

pytestmark = pytest.mark.timeout(180)

MLP = LayerList((
    ("Linear", {"in_features": 4, "out_features": 8}),
    ("ReLU", {}),
    ("Linear", {"in_features": 8, "out_features": 3}),
))
PLAN = Plan("hand", (StagePlan((0, 0), (0,), (2,), 5), StagePlan((1, 1), (1,), (2,), 3),
                     StagePlan((2, 2), (2,), (2,), 1)), micro_batch=2, num_micro_batches=8)


def pool(speed: float = 1.0) -> HomePool:
    return HomePool("home", tuple(DeviceSpec(f"dev{i}", speed, 1 << 30, 1e9) for i in range(3)))


def data() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(16, 4), torch.randint(0, 3, (16,))


def assert_gone(pids) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_worker_killed_mid_round_is_reported_and_everything_stops():
    x, y = data()
    with HomePipeline(MLP, pool(speed=0.002), PLAN, emulate="sleep", timeout_s=60) as home:
        pids = home.worker_pids
        killer = threading.Timer(1.0, os.kill, (pids[1], signal.SIGKILL))
        killer.start()
        try:  # found dead by its exit code, not by the 60 s timeout (that would be a WorkerTimeout)
            with pytest.raises(WorkerDied, match=r"device 1 \(dev1\) went away \(exit code -9\)"):
                home.train(None, x, y, 50, lr=0.1)
        finally:
            killer.cancel()
    assert_gone(pids.values())


def test_device_that_never_joins_is_unreachable():
    # 90 s in all: on a loaded machine the two workers that do start may need a minute to import torch;
    # once they have joined, the device that was not started here has 3 s
    home = HomePipeline(MLP, pool(), PLAN, timeout_s=90, local_devices=[0, 1], join_timeout_s=3)
    with pytest.raises(DeviceUnreachable, match=r"device\(s\) 2 \(dev2\) did not join the home within 3 s of the "
                                                r"devices started here"):
        with home:
            pass
    assert_gone(home.worker_pids.values())


def test_peer_without_the_home_secret_is_refused():
    """An impostor claiming device 2 is turned away at its knock; the real device 2 never comes: the error names
    both."""
    (port,) = free_ports(1)
    impostor = LocalDevices()
    impostor.start(2, ("127.0.0.1", port), b"not the home secret")
    home = HomePipeline(MLP, pool(), PLAN, timeout_s=90, port=port, local_devices=[0, 1], join_timeout_s=10)
    try:
        with pytest.raises(DeviceUnreachable,
                           match=r"2 \(dev2\) did not join.*from 127.0.0.1 knocked without the home's secret"):
            with home:
                pass
    finally:
        impostor.stop(grace_s=10)
    assert impostor.exited()[2] != 0  # the impostor was turned away, not let in
    assert_gone(list(home.worker_pids.values()) + list(impostor.pids.values()))


def test_strangers_at_the_control_port_disturb_nothing():
    """Silent, garbage-sending and wrong-secret peers are refused while the real devices join and train."""
    (port,) = free_ports(1)
    impostor, real = LocalDevices(), LocalDevices()
    impostor.start(1, ("127.0.0.1", port), b"not the home secret")
    home = HomePipeline(MLP, pool(), PLAN, timeout_s=120, port=port, local_devices=[0, 2])
    strangers: list[socket.socket] = []

    def visit() -> None:
        """Loiter at the door (silent, then nonsense); let the real device 1 come once the impostor was sent away."""
        deadline = time.monotonic() + 120
        while len(strangers) < 2 and time.monotonic() < deadline:
            try:
                strangers.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                time.sleep(0.05)
        strangers[-1].sendall(b"\xff" * 200)  # more than a knock's bytes: refused at once
        while 1 not in impostor.exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        real.start(1, ("127.0.0.1", port), home.secret)

    thread = threading.Thread(target=visit)
    thread.start()
    try:
        with home:
            x = torch.randn(32, 4)
            result = home.train(None, x, torch.randint(0, 3, (32,)), 2, lr=0.1)
    finally:
        thread.join(timeout=120)
        for sock in strangers:
            sock.close()
        impostor.stop(grace_s=10)
        real.stop(grace_s=10)
    assert len(result.sync_round_s) == 2
    assert any("knocked without the home's secret" in reason for reason in home.refused)  # the impostor
    assert any("sent no knock" in reason for reason in home.refused), home.refused  # the nonsense
    assert impostor.exited()[1] != 0


@pytest.mark.parametrize("device_secret, portal_secret", [(b"a" * 32, b"b" * 32), (b"b" * 32, b"b" * 32)])
def test_handshake_both_ways(device_secret, portal_secret):
    portal_end, device_end = socket.socketpair()
    outcome: dict[str, object] = {}

    def device() -> None:
        try:
            channel = join_home(device_end, device_secret, 7)
            send_message(channel, {"type": "hello from the device"}, {"x": np.arange(3.0)})
            outcome["device"] = "joined"
        except AuthenticationFailed as error:
            outcome["device"] = error

    thread = threading.Thread(target=device)
    thread.start()
    try:
        admitted = admit_peer(portal_end, portal_secret)
        device, channel = admitted.device, admitted.channel
        header, arrays = recv_message(channel)  # the sealed channel both ends derived
        outcome["portal"] = (device, header["type"], arrays["x"].tolist())
    except AuthenticationFailed as error:
        outcome["portal"] = error
    thread.join(timeout=10)
    portal_end.close()
    device_end.close()
    if device_secret == portal_secret:
        assert outcome == {"portal": (7, "hello from the device", [0.0, 1.0, 2.0]), "device": "joined"}
    else:
        assert isinstance(outcome["portal"], AuthenticationFailed)
        assert isinstance(outcome["device"], AuthenticationFailed)


def test_device_refuses_a_portal_without_the_secret():
    """A device follows only a portal that proves the secret (no spec, no tensors from strangers)."""
    portal_end, device_end = socket.socketpair()
    errors: list[Exception] = []

    def device() -> None:
        try:
            join_home(device_end, b"s" * 32, 0)
        except AuthenticationFailed as error:
            errors.append(error)

    thread = threading.Thread(target=device)
    thread.start()
    send_message(portal_end, {"type": "challenge", "nonce": "00" * 32})
    recv_message(portal_end)
    send_message(portal_end, {"type": "welcome", "mac": "ff" * 32})  # a forged welcome
    thread.join(timeout=10)
    portal_end.close()
    device_end.close()
    assert errors and "failed to prove" in str(errors[0])
