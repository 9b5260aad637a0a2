"""The one connect-and-join: a listener that starts late is reached, a wrong secret is not retried."""

from __future__ import annotations

import threading
import time

import pytest

from ecofl.net.auth import CONTROL
from ecofl.net.dial import Unreachable, dial
from ecofl.net.door import Door
from ecofl.net.errors import AuthenticationFailed
from ecofl.net.wire import recv_message, send_message
from helpers import SECRET, free_ports, holds_for, wait_for

LOOPBACK = "127.0.0.1"


def echo_door(port: int, admitted: list, secret: bytes = SECRET) -> Door:
    """A door on ``port`` that answers each admitted peer's first message with the same message."""
    def answer(peer) -> None:
        admitted.append(peer)
        header, _ = recv_message(peer.channel)
        send_message(peer.channel, header)
        peer.channel.close()

    return Door(LOOPBACK, port, secret, lambda purpose: purpose == CONTROL,
                lambda peer: threading.Thread(target=answer, args=(peer,), daemon=True).start(), name="echo")


def test_a_listener_that_starts_late_is_reached_within_the_retry_window():
    (port,) = free_ports(1)
    admitted: list = []
    doors: list[Door] = []
    late = threading.Timer(0.5, lambda: doors.append(echo_door(port, admitted)))
    late.start()
    try:
        channel = dial((LOOPBACK, port), SECRET, 3, retry_for_s=30)
        with channel:
            send_message(channel, {"type": "hi", "from": 3})
            header, _ = recv_message(channel)
        assert header == {"type": "hi", "from": 3}
        assert [(peer.device, peer.purpose) for peer in admitted] == [(3, CONTROL)]
    finally:
        late.join()
        for door in doors:
            door.close()


def test_no_listener_and_no_retry_window_is_unreachable_at_once():
    (port,) = free_ports(1)
    started = time.monotonic()
    with pytest.raises(Unreachable, match=f"cannot reach {LOOPBACK}:{port}"):
        dial((LOOPBACK, port), SECRET, 0)
    assert time.monotonic() - started < 5  # one try, not a wait


def test_the_abort_check_runs_between_tries():
    (port,) = free_ports(1)
    tries = []

    def abort() -> None:
        tries.append(1)
        if len(tries) == 3:
            raise InterruptedError("asked to stop")

    with pytest.raises(InterruptedError):
        dial((LOOPBACK, port), SECRET, 0, retry_for_s=60, abort=abort)
    assert len(tries) == 3


def test_a_wrong_secret_fails_once_and_is_not_tried_again():
    (port,) = free_ports(1)
    refusals: list[str] = []
    with Door(LOOPBACK, port, b"another home's secret" * 2, lambda purpose: True, lambda peer: None,
              name="other", on_refused=refusals.append) as door:
        with pytest.raises(AuthenticationFailed):
            dial((LOOPBACK, port), SECRET, 0, retry_for_s=30)
        wait_for(lambda: door.refused == 1, timeout_s=10, what="the refusal")
        # a second try would come RETRY_PAUSE_S later: none comes
        holds_for(lambda: door.refused == 1 and len(refusals) == 1, seconds=1.0, what="one refusal only")
