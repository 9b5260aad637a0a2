"""Asking a running home service what it holds (``ecofl home status``), and the client's channel to it.

Kept free of torch and the pipeline so that a status query starts and answers
in well under a second, even while the home is under attack (issue 25).
"""

from __future__ import annotations

import dataclasses

from ecofl.deploy.service_messages import CLIENT, TO_CLIENT, HomeStatus, StatusRequest
from ecofl.net.dial import dial
from ecofl.net.schema import encode
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import recv_message, send_message


def connect_to_service(address: tuple[str, int], secret: bytes, timeout_s: float) -> SealedSocket:
    """A sealed channel to the home service at ``address``, as its client (proves the home's secret)."""
    return dial(address, secret, 0, CLIENT, timeout_s=timeout_s)


def home_status(address: tuple[str, int], secret: bytes, timeout_s: float = 10.0) -> dict:
    """The service's registry: devices present, rounds trained, peers refused.

    Raises ``OSError`` when the service is unreachable, ``AuthenticationFailed``
    when it holds another secret, and ``ValueError`` when it answers anything
    but a status.
    """
    with connect_to_service(address, secret, timeout_s) as sock:
        send_message(sock, encode(StatusRequest()))
        header, _ = recv_message(sock)
    reply = TO_CLIENT.decode(header)
    if not isinstance(reply, HomeStatus):
        raise ValueError(f"the home service answered {reply.TYPE!r} to a status request")
    return dataclasses.asdict(reply)
