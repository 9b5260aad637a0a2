"""Admitting devices into a home: every control channel proves the home's secret before anything else.

Each connection's handshake runs on a thread of its own with a time limit,
so a peer that says nothing, sends garbage or does not know the secret holds
up nobody: it is refused (and counted) while the devices of the plan join.
An admitted device's control channel continues sealed (:mod:`ecofl.net.sealed`).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Callable

from ecofl.net.auth import admit_device
from ecofl.net.errors import AuthenticationFailed, ChannelClosed
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.errors import DeviceUnreachable, HomePipelineError

HANDSHAKE_TIMEOUT_S = 10.0


def admit_devices(
    listener: socket.socket, secret: bytes, expected: dict[int, str], timeout_s: float,
    check: Callable[[], None] = lambda: None, refused: list[str] | None = None,
    local: set[int] = frozenset(), then_s: float | None = None,
) -> dict[int, SealedSocket]:
    """Accept and authenticate every device of ``expected`` (index -> name), or fail by the deadline.

    The deadline is ``timeout_s``; with ``then_s``, the devices not in
    ``local`` (started elsewhere, invited) have at most ``then_s`` more once
    every ``local`` device has joined (local workers may take long to start
    on a loaded machine; a remote device that is not there by then is not
    coming).

    ``check`` runs while waiting (e.g. raising when a local worker already
    exited). A peer that fails the handshake is refused, its reason appended
    to ``refused``, and admission goes on; a device that does not join in time
    is :class:`DeviceUnreachable` (naming the refused peers, which may be it
    with the wrong secret); a peer with the secret claiming a device the plan
    does not expect, or one that joined already, is a :class:`HomePipelineError`.
    On any failure the channels admitted so far are closed.
    """
    refused = [] if refused is None else refused
    connections: dict[int, SealedSocket] = {}
    arrived: queue.Queue[tuple[int, SealedSocket] | str] = queue.Queue()
    deadline = time.time() + timeout_s
    bound = f"within {timeout_s:.0f} s"
    listener.settimeout(0.05)
    try:
        while len(connections) < len(expected):
            check()
            while not arrived.empty():
                outcome = arrived.get()
                if isinstance(outcome, str):
                    refused.append(outcome)
                    continue
                device, channel = outcome
                if device not in expected or device in connections:
                    channel.close()
                    raise HomePipelineError(f"device {device} joined but is not expected by the plan (or twice)")
                connections[device] = channel
                if then_s is not None and local <= set(connections) and time.time() + then_s < deadline:
                    deadline, bound = time.time() + then_s, f"within {then_s:.0f} s of the devices started here"
            if len(connections) == len(expected):
                break
            if time.time() > deadline:
                missing = sorted(set(expected) - set(connections))
                why = f"; refused: {'; '.join(refused)}" if refused else ""
                raise DeviceUnreachable(
                    f"device(s) {', '.join(f'{d} ({expected[d]})' for d in missing)} did not join the home "
                    f"{bound}{why}"
                )
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=_handshake, args=(sock, secret, arrived), daemon=True,
                             name="control-handshake").start()
    except BaseException:
        for channel in connections.values():
            channel.close()
        raise
    return connections


def _handshake(sock: socket.socket, secret: bytes, arrived: queue.Queue) -> None:
    """Admit one peer: put (device, channel) or the reason it was refused into ``arrived``."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        device, channel = admit_device(sock, secret)
    except AuthenticationFailed as error:
        sock.close()
        arrived.put(str(error))
        return
    except (ChannelClosed, ValueError, OSError) as error:
        sock.close()
        arrived.put(f"a peer broke off authentication: {error}")
        return
    channel.settimeout(None)
    arrived.put((device, channel))
