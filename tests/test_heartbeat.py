"""The heartbeat channel with real processes: kill -9 and SIGSTOP are detected and named, fast."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from ecofl.net.auth import admit_peer, join_home, new_secret
from ecofl.net.heartbeat import HeartbeatMonitor, HeartbeatSender
from ecofl.net.liveness import CLOSED, SILENT, LivenessSettings
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import LENGTH, send_message
from ecofl.pipeline.runtime.control_plane import hang_up
from ecofl.pipeline.runtime.reply_wait import next_reply
from helpers import answer_of, holds_for, wait_for

SETTINGS = LivenessSettings(period_s=0.1, suspect_after_s=0.6, probe_timeout_s=0.6)

SENDER = """
import sys, time
from ecofl.net.heartbeat import HeartbeatSender
host, port, device, secret = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4])
HeartbeatSender((host, port), secret, device, 0.1)
print("joined", flush=True)
while True:  # the main thread 'computes'; beats come from the sender's thread
    sum(i * i for i in range(100000))
"""


def start_sender(monitor: HeartbeatMonitor, device: int, secret: bytes) -> subprocess.Popen:
    host, port = monitor.address
    process = subprocess.Popen([sys.executable, "-c", SENDER, host, str(port), str(device), secret.hex()],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "joined"
    return process


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_killed_or_frozen_device_is_named_within_the_detection_bound(how):
    secret = new_secret()
    announced: list[int] = []
    with HeartbeatMonitor(secret, [0, 1], SETTINGS, on_failure=announced.append) as monitor:
        busy = start_sender(monitor, 0, secret)
        victim = start_sender(monitor, 1, secret)
        try:
            wait_for(lambda: monitor.connected() == {0, 1})
            # beats keep both alive past the suspicion time while they compute
            holds_for(lambda: monitor.failures() == {}, 1.5, what="no failure")
            os.kill(victim.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            took = wait_for(lambda: monitor.failures())
            failure = monitor.failures()[1]
            assert set(monitor.failures()) == {1}
            assert failure.reason == (CLOSED if how == "kill" else SILENT)
            assert took < SETTINGS.detection_bound_s + 10  # generous on a loaded machine; never a round deadline
            wait_for(lambda: announced == [1], what="the failure announced")
            holds_for(lambda: announced == [1], 1.0, what="announced once")
        finally:
            for process in (busy, victim):
                process.kill()
                process.wait()


def test_a_peer_without_the_secret_is_never_watched_and_learns_nothing():
    with HeartbeatMonitor(new_secret(), [0], SETTINGS) as monitor:
        with pytest.raises(Exception):
            HeartbeatSender(monitor.address, new_secret(), 0, 0.1)
        with socket.create_connection(monitor.address, timeout=30) as intruder:
            try:
                for _ in range(8):  # beats where a knock belongs: more than a knock's bytes
                    send_message(intruder, {"type": "beat"})
            except (ConnectionResetError, BrokenPipeError):
                pass  # the door hung up as soon as it had read a knock's worth
            assert answer_of(intruder) == "closed"  # without a word, not even a challenge
            holds_for(lambda: monitor.connected() == set(), 0.3, what="no one watched")
        assert monitor.connected() == set()


def test_a_failure_announced_ends_the_read_of_a_reply_the_device_froze_half_way_through():
    """A device frozen while it sends a reply: the portal's read of the rest would wait for its deadline (60 s
    in a chaos trial); the monitor's announcement shuts the channel and the read ends at once."""
    portal_end, device_end = socket.socketpair()
    secret = new_secret()
    joined: list[SealedSocket] = []
    thread = threading.Thread(target=lambda: joined.append(join_home(device_end, secret, 1)))
    thread.start()
    portal = admit_peer(portal_end, secret).channel
    thread.join(timeout=10)
    try:
        body = json.dumps({"type": "done", "padding": "x" * 1000}).encode()
        joined[0].sendall(LENGTH.pack(len(body)) + body[:100])  # frozen after a tenth of it
        replies: list[object] = []
        reader = threading.Thread(target=lambda: replies.append(next_reply(portal, time.monotonic() + 60, "d1")))
        reader.start()
        holds_for(lambda: reader.is_alive(), 0.5, what="the read waiting for the rest")
        hang_up(portal)
        reader.join(timeout=30)  # generous on a loaded machine, and half the read's own deadline
        assert not reader.is_alive() and replies == [None]
    finally:
        joined[0].close()
        portal.close()
