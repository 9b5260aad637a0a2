"""Safety's work at idle priority (ecofl.thread_priority): who is lowered, who is raised, and when.

What each thread's scheduling policy was is read from the kernel (``sched_getscheduler`` of its native id) at the
moment it did its work, not inferred from timing."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from ecofl.net.links import HEADER, REPLICA_TAG, PeerLink
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.copy_thread import CopyThread
from ecofl.thread_priority import BACKGROUND_ENV, SwitchedPriority, background_at_idle, can_raise, policy_of

linux_only = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
needs_raise = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE") or not can_raise(),
                                 reason="raising a thread back from SCHED_IDLE needs CAP_SYS_NICE (root)")
WAIT_S = 30.0  # generous: the machine may be loaded


def my_policy() -> int:
    return policy_of(threading.get_native_id())


def test_the_environment_chooses_idle_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BACKGROUND_ENV, raising=False)
    assert not background_at_idle()  # a shared host: idle would mean "while nothing else on the host runs"
    monkeypatch.setenv(BACKGROUND_ENV, "normal")
    assert not background_at_idle()
    monkeypatch.setenv(BACKGROUND_ENV, "low")
    with pytest.raises(ValueError, match="expected one of idle, normal"):
        background_at_idle()


@linux_only
def test_idle_is_chosen_on_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BACKGROUND_ENV, "idle")
    assert background_at_idle()


@linux_only
@pytest.mark.parametrize("setting, expected", [("idle", "SCHED_IDLE"), ("normal", "SCHED_OTHER")])
def test_a_copy_thread_runs_at_the_chosen_priority(monkeypatch: pytest.MonkeyPatch, setting: str,
                                                   expected: str) -> None:
    monkeypatch.setenv(BACKGROUND_ENV, setting)
    seen = []
    copy = CopyThread("replica-receiver", lambda stopped: seen.append(my_policy()))
    copy.join(lambda: None)
    assert seen == [getattr(os, expected)]
    assert my_policy() == os.SCHED_OTHER  # the caller is not lowered


@needs_raise
def test_switched_priority_lowers_for_background_and_an_urgent_post_raises_it() -> None:
    priority = SwitchedPriority(active=True)
    lowered, go_on, seen = threading.Event(), threading.Event(), []

    def worker() -> None:
        priority.background()
        seen.append(my_policy())
        lowered.set()
        assert go_on.wait(WAIT_S)
        priority.background()  # foreground work waits for it (urgent): it does not lower itself again
        seen.append(my_policy())
        priority.foreground()
        priority.background()  # that work started: background again is idle again
        seen.append(my_policy())
        priority.foreground()
        seen.append(my_policy())

    thread = threading.Thread(target=worker)
    thread.start()
    assert lowered.wait(WAIT_S)
    priority.urgent()  # from another thread, while it is lowered
    assert policy_of(thread.native_id) == os.SCHED_OTHER
    go_on.set()
    thread.join(WAIT_S)
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_OTHER]


@linux_only
def test_an_inactive_priority_leaves_the_thread_as_it_is() -> None:
    seen = []

    def worker() -> None:
        priority = SwitchedPriority(active=False)
        priority.background()
        seen.append(my_policy())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(WAIT_S)
    assert seen == [os.SCHED_OTHER]


class RecordingSocket(SealedSocket):
    """A sealed socket that notes the policy of the thread of every send and receive, by bytes; a send of
    ``hold_bytes`` waits for ``release`` (a replica piece still being sealed)."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes, hold_bytes: int = -1):
        super().__init__(sock, send_key, recv_key)
        self.sent: list[tuple[int, int]] = []
        self.received: list[tuple[int, int]] = []
        self.hold_bytes, self.holding, self.release = hold_bytes, threading.Event(), threading.Event()

    def sendall(self, data: bytes | bytearray | memoryview) -> None:
        nbytes = memoryview(data).nbytes
        self.sent.append((nbytes, my_policy()))
        if nbytes == self.hold_bytes:
            self.holding.set()
            assert self.release.wait(WAIT_S)
        super().sendall(data)

    def recv_into(self, buffer: bytearray | memoryview, nbytes: int = 0) -> int:
        count = super().recv_into(buffer, nbytes)
        self.received.append((count, my_policy()))
        return count


def linked(hold_bytes: int = -1) -> tuple[PeerLink, PeerLink, RecordingSocket, RecordingSocket]:
    near, far = socket.socketpair()
    forward, backward = os.urandom(32), os.urandom(32)
    sending = RecordingSocket(near, forward, backward, hold_bytes)
    receiving = RecordingSocket(far, backward, forward)
    return PeerLink(sending, 0, idle_background=True), PeerLink(receiving, 0, idle_background=True), sending, receiving


PIECE = 256 << 10  # above SMALL_BYTES: its header and its bytes are sent apart
ACTIVATION = 1000  # floats: one record with its header


@needs_raise
def test_a_link_carries_replica_pieces_at_idle_priority_and_activations_at_normal() -> None:
    sender, receiver, sending, receiving = linked()
    try:
        piece, activation = torch.arange(PIECE, dtype=torch.uint8), torch.randn(ACTIVATION)
        sender.post(piece, REPLICA_TAG, background=True).wait(WAIT_S)
        sender.post(activation, 0).wait(WAIT_S)
        assert torch.equal(receiver.take(REPLICA_TAG, WAIT_S), piece)
        assert torch.equal(receiver.take(0, WAIT_S), activation)
    finally:
        sender.close()
        receiver.close()
    idle, other = os.SCHED_IDLE, os.SCHED_OTHER
    assert sending.sent == [(HEADER.size, idle), (PIECE, idle), (HEADER.size + 4 * ACTIVATION, other)]
    piece_header, *piece_reads, activation_header, activation_bytes = receiving.received
    assert piece_header == (HEADER.size, other)  # the reader learns the tag from the header
    assert sum(n for n, _ in piece_reads) == PIECE and {policy for _, policy in piece_reads} == {idle}
    assert activation_header == (HEADER.size, other) and activation_bytes == (4 * ACTIVATION, other)


@needs_raise
def test_an_activation_posted_while_a_piece_is_sealed_raises_the_sender_at_once() -> None:
    sender, receiver, sending, _ = linked(hold_bytes=PIECE)
    try:
        ticket = sender.post(torch.zeros(PIECE, dtype=torch.uint8), REPLICA_TAG, background=True)
        assert sending.holding.wait(WAIT_S)
        assert policy_of(sender._sender.native_id) == os.SCHED_IDLE  # sealing its piece, lowered
        activation = sender.post(torch.randn(ACTIVATION), 0)
        assert policy_of(sender._sender.native_id) == os.SCHED_OTHER  # raised by the post, mid-piece
        sending.release.set()
        ticket.wait(WAIT_S)
        activation.wait(WAIT_S)
        assert receiver.take(0, WAIT_S).numel() == ACTIVATION
    finally:
        sending.release.set()
        sender.close()
        receiver.close()


@needs_raise
def test_an_activation_that_steps_in_front_of_a_paced_piece_goes_at_normal_priority() -> None:
    sender, receiver, sending, _ = linked()
    try:
        bucket = TokenBucket(PIECE / 2, burst_bytes=1)  # the piece takes the link 2 s
        piece = sender.post(torch.zeros(PIECE, dtype=torch.uint8), REPLICA_TAG, bucket, background=True)
        threading.Event().wait(0.3)  # the piece is being paced (if not yet, the activation simply goes first)
        sender.post(torch.randn(ACTIVATION), 0, bucket).wait(WAIT_S)
        piece.wait(WAIT_S)
        assert receiver.take(0, WAIT_S).numel() == ACTIVATION
    finally:
        sender.close()
        receiver.close()
    # the activation first; then the piece (paced before it is sent), lowered again after the activation
    idle, other = os.SCHED_IDLE, os.SCHED_OTHER
    assert sending.sent == [(HEADER.size + 4 * ACTIVATION, other), (HEADER.size, idle), (PIECE, idle)]
