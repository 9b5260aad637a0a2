"""Every connection inside a home proves the home's secret: mutual HMAC challenge-response, then a sealed channel.

Runs first on every channel (control, heartbeat, tensor links, the home
service's), before anything else is revealed or accepted, once the
connector's knock (:mod:`.knock`, sent by :func:`~ecofl.net.dial.dial`) has
let it past the door::

    connector -> acceptor   knock: nonce | purpose | MAC, 116 bytes    (a knock under another secret: "rejected")
    acceptor  -> connector  {"type": "challenge", "nonce": Na}
    connector -> acceptor   {"type": "hello", "device": d, "purpose": p, "nonce": Nc,
                             "mac": HMAC(k, "device" | Na | Nc | d | p)}
    acceptor  -> connector  {"type": "welcome", "mac": HMAC(k, "portal" | Nc | Na | d | p)}   or {"type": "rejected"}

Both sides compare MACs in constant time; fresh 32-byte nonces on both sides
stop replays; the acceptor's MAC stops a connector from following an acceptor
that does not hold the secret; the purpose (``"control"``, ``"heartbeat"``,
``"data epoch 3 to rank 1"``, ...) binds a proof to the one kind of channel
it was made for. HMAC-SHA256 (RFC 2104). Both ends then derive the
connection's keys from the secret and both nonces and continue on a
:class:`~ecofl.net.sealed.SealedSocket`: whoever did not take part in the
handshake can neither read nor inject a byte.

Each of these messages comes from a peer that has proved nothing yet, so
each is a typed message read by :mod:`.preauth` (a deadline for the whole
handshake, a bounded header, the fields' types, ranges and patterns): a
claimed device is a number from 0 to :data:`MAX_DEVICE`, a purpose a short
phrase, a nonce or MAC 64 hex digits. For the acceptor every way a handshake
can fail ends in :class:`AuthenticationFailed`, and in nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Annotated

from ecofl.net.errors import AuthenticationFailed
from ecofl.net.preauth import read_preauth, send_preauth
from ecofl.net.schema import MalformedMessage, Matches, MessageSet, Within, message
from ecofl.net.sealed import SealedSocket, channel_keys

NONCE_BYTES = 32
CONTROL = "control"  # the purpose of a worker's control channel to its portal
MAX_DEVICE = 4095  # the largest device number (or rank) a peer may claim
HANDSHAKE_DEADLINE_S = 10.0  # a whole handshake, from the challenge to the welcome
SECRET_ENV = "ECOFL_HOME_SECRET"  # the home's secret (hex) in a process's environment, never on a command line

Hex32 = Annotated[str, Matches(f"[0-9a-f]{{{2 * NONCE_BYTES}}}")]  # a nonce or a MAC


@message("challenge")
class Challenge:
    nonce: Hex32


@message("hello")
class Hello:
    device: Annotated[int, Within(0, MAX_DEVICE)]
    purpose: Annotated[str, Matches("[a-z0-9 ]{1,64}")]
    nonce: Hex32
    mac: Hex32


@message("welcome")
class Welcome:
    mac: Hex32


@message("rejected")
class Rejected:
    pass


def new_secret() -> bytes:
    """A fresh random home secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: str, first: str, second: str, device: int, purpose: str) -> str:
    message = f"{role}|{first}|{second}|{device}|{purpose}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _sealed(sock: socket.socket, secret: bytes, acceptor_nonce: str, connector_nonce: str, device: int,
            purpose: str, acceptor: bool) -> SealedSocket:
    to_connector, to_acceptor = channel_keys(secret, bytes.fromhex(acceptor_nonce), bytes.fromhex(connector_nonce),
                                             f"{purpose}|{device}")
    return SealedSocket(sock, to_connector, to_acceptor) if acceptor else SealedSocket(sock, to_acceptor, to_connector)


@dataclass(frozen=True)
class Admitted:
    """A peer that proved the secret: who it claims to be, for what, and the sealed channel to it."""

    device: int
    purpose: str
    channel: SealedSocket


def admit_peer(sock: socket.socket, secret: bytes, deadline: float | None = None) -> Admitted:
    """Acceptor side: challenge the peer on ``sock``; its claim and a sealed channel once it proves the secret.

    The whole handshake must be over by ``deadline`` (``time.monotonic()``;
    default :data:`HANDSHAKE_DEADLINE_S` from now). Raises
    :class:`AuthenticationFailed`, and nothing else, if the peer does not
    prove the secret by then: a wrong proof (the peer is told ``rejected``),
    a malformed hello, a connection that ends or breaks, or time out. The
    caller checks that the claimed purpose is one it serves.
    """
    peer = _peer(sock)
    deadline = time.monotonic() + HANDSHAKE_DEADLINE_S if deadline is None else deadline
    try:
        acceptor_nonce = secrets.token_hex(NONCE_BYTES)
        send_preauth(sock, Challenge(acceptor_nonce), deadline)
        hello = read_preauth(sock, HELLO, deadline)
        expected = _mac(secret, "device", acceptor_nonce, hello.nonce, hello.device, hello.purpose)
        if not hmac.compare_digest(hello.mac, expected):
            try:
                send_preauth(sock, Rejected(), deadline)
            except OSError:
                pass  # a peer that has gone needs no answer; the refusal names what it did
            raise AuthenticationFailed(f"peer {peer} claiming device {hello.device} failed authentication")
        mac = _mac(secret, "portal", hello.nonce, acceptor_nonce, hello.device, hello.purpose)
        send_preauth(sock, Welcome(mac), deadline)
    except MalformedMessage as error:
        raise AuthenticationFailed(f"peer {peer} sent a malformed hello: {error}") from None
    except TimeoutError:
        raise AuthenticationFailed(f"peer {peer} did not complete the handshake in time") from None
    except OSError as error:  # ChannelClosed, a reset, a broken pipe
        raise AuthenticationFailed(f"peer {peer} broke off the handshake: {error}") from None
    channel = _sealed(sock, secret, acceptor_nonce, hello.nonce, hello.device, hello.purpose, True)
    return Admitted(hello.device, hello.purpose, channel)


def join_home(sock: socket.socket, secret: bytes, device: int, purpose: str = CONTROL,
              deadline: float | None = None) -> SealedSocket:
    """Connector side: answer the challenge as ``device`` for ``purpose``, check the acceptor's proof in turn.

    By ``deadline`` (default :data:`HANDSHAKE_DEADLINE_S` from now:
    TimeoutError after); an acceptor that does not prove the secret, or
    says anything malformed, is :class:`AuthenticationFailed`; a connection
    that ends first is :class:`~ecofl.net.errors.ChannelClosed`. The
    socket's own timeout is as it was afterwards.
    """
    deadline = time.monotonic() + HANDSHAKE_DEADLINE_S if deadline is None else deadline
    timeout = sock.gettimeout()
    try:
        challenge = read_preauth(sock, CHALLENGE_OR_REJECTED, deadline)
        if isinstance(challenge, Rejected):
            raise AuthenticationFailed(f"the home's door refused device {device}'s knock: wrong home secret")
        connector_nonce = secrets.token_hex(NONCE_BYTES)
        mac = _mac(secret, "device", challenge.nonce, connector_nonce, device, purpose)
        send_preauth(sock, Hello(device, purpose, connector_nonce, mac), deadline)
        answer = read_preauth(sock, ANSWER, deadline)
    except MalformedMessage as error:
        raise AuthenticationFailed(f"the portal is not one of this home's: {error}") from None
    if isinstance(answer, Rejected):
        raise AuthenticationFailed(f"the portal rejected device {device}: wrong home secret")
    expected = _mac(secret, "portal", connector_nonce, challenge.nonce, device, purpose)
    if not hmac.compare_digest(answer.mac, expected):
        raise AuthenticationFailed("the portal failed to prove the home secret")
    sock.settimeout(timeout)
    return _sealed(sock, secret, challenge.nonce, connector_nonce, device, purpose, False)


CHALLENGE_OR_REJECTED, HELLO, ANSWER = MessageSet(Challenge, Rejected), MessageSet(Hello), MessageSet(Welcome, Rejected)


def _peer(sock: socket.socket) -> str:
    try:
        address = sock.getpeername()
    except OSError:
        return "(disconnected)"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else repr(address or "(local socket)")
