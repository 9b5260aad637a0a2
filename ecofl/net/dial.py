"""Connect to a listener of the home and prove the secret: the one connect-and-join of every connector.

Every connecting end inside a home dials through :func:`dial`: a worker to
its portal's control port, a device to the portal's heartbeat monitor, a
data link to a peer's listener, a device daemon and ``ecofl home status`` to
the home service. One policy for all of them:

- a listener that refuses or cannot be reached (it may still be starting) is
  tried again every :data:`RETRY_PAUSE_S` until ``retry_for_s`` has passed
  (0: one try); a caller's ``abort`` check runs between tries;
- the first bytes on a new connection are its knock (:mod:`.knock`), sent
  unasked: without it no door of a home looks further;
- a connection that is made but whose handshake fails is not tried again: a
  wrong secret stays wrong, and a peer that breaks off is the caller's to judge;
- one ``timeout_s`` bounds the connection attempt, the whole handshake, and
  every blocking call on the channel afterwards until the caller sets another.

A device daemon that loses its home service reconnects with a back-off of
its own (:mod:`ecofl.deploy.device_daemon`): that is a session being
re-established, not a connection attempt, and each of its attempts is a
:func:`dial` of one try.
"""

from __future__ import annotations

import socket
import time
from typing import Callable

from ecofl.net.auth import CONTROL, HANDSHAKE_DEADLINE_S, join_home
from ecofl.net.knock import knock_frame
from ecofl.net.sealed import SealedSocket

RETRY_PAUSE_S = 0.1  # between two tries at a listener that is not there yet


class Unreachable(ConnectionError):
    """No connection could be made to the listener (refused, unreachable, or timed out) in the time given."""


def dial(address: tuple[str, int], secret: bytes, device: int, purpose: str = CONTROL, *,
         timeout_s: float = HANDSHAKE_DEADLINE_S, retry_for_s: float = 0.0,
         abort: Callable[[], None] = lambda: None) -> SealedSocket:
    """A sealed channel to the listener at ``address``, joined as ``device`` for ``purpose`` (module docstring).

    Raises :class:`Unreachable` when no connection was made by the end of
    ``retry_for_s``; from the handshake, :class:`~ecofl.net.errors.AuthenticationFailed`
    (the listener is not one of this home's, or refused the proof),
    :class:`~ecofl.net.errors.ChannelClosed` or ``TimeoutError``; and
    whatever ``abort`` raises. The channel has ``TCP_NODELAY`` set.
    """
    give_up = time.monotonic() + retry_for_s
    while True:
        try:
            sock = socket.create_connection(address, timeout=timeout_s)
            break
        except OSError as error:
            if time.monotonic() >= give_up:
                raise Unreachable(f"cannot reach {address[0]}:{address[1]}: {error}") from None
        time.sleep(RETRY_PAUSE_S)
        abort()
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(knock_frame(secret, purpose))
        return join_home(sock, secret, device, purpose, deadline=time.monotonic() + timeout_s)
    except BaseException:
        sock.close()
        raise
