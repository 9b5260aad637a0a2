"""Every connection inside a home proves the home's secret: mutual HMAC challenge-response, then a sealed channel.

Runs first on every channel (control, heartbeat, tensor links, the home
service's), before anything else is revealed or accepted::

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
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
from dataclasses import dataclass

from ecofl.net.errors import AuthenticationFailed
from ecofl.net.sealed import SealedSocket, channel_keys
from ecofl.net.wire import recv_message, send_message

NONCE_BYTES = 32
CONTROL = "control"  # the purpose of a worker's control channel to its portal


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


def admit_peer(sock: socket.socket, secret: bytes) -> Admitted:
    """Acceptor side: challenge the peer on ``sock``; its claim and a sealed channel once it proves the secret.

    Raises :class:`AuthenticationFailed` (after telling the peer) if it does
    not; the caller checks that the claimed purpose is one it serves.
    """
    acceptor_nonce = secrets.token_hex(NONCE_BYTES)
    send_message(sock, {"type": "challenge", "nonce": acceptor_nonce})
    hello, _ = recv_message(sock, authenticated=False)
    try:
        device = int(hello["device"])
        purpose = str(hello["purpose"])
        connector_nonce = str(hello["nonce"])
        claimed = str(hello["mac"])
        bytes.fromhex(connector_nonce)
    except (KeyError, TypeError, ValueError):
        raise AuthenticationFailed(f"peer {_peer(sock)} sent a malformed hello") from None
    if hello.get("type") != "hello" or len(connector_nonce) != 2 * NONCE_BYTES:
        raise AuthenticationFailed(f"peer {_peer(sock)} sent a malformed hello")
    if not hmac.compare_digest(claimed, _mac(secret, "device", acceptor_nonce, connector_nonce, device, purpose)):
        send_message(sock, {"type": "rejected"})
        raise AuthenticationFailed(f"peer {_peer(sock)} claiming device {device} failed authentication")
    mac = _mac(secret, "portal", connector_nonce, acceptor_nonce, device, purpose)
    send_message(sock, {"type": "welcome", "mac": mac})
    return Admitted(device, purpose, _sealed(sock, secret, acceptor_nonce, connector_nonce, device, purpose, True))


def admit_device(sock: socket.socket, secret: bytes, purpose: str = CONTROL) -> tuple[int, SealedSocket]:
    """Acceptor side for one kind of channel: the peer's device number and sealed channel.

    A peer with the secret that asks for another kind of channel is refused
    too (:class:`AuthenticationFailed`).
    """
    admitted = admit_peer(sock, secret)
    if admitted.purpose != purpose:
        raise AuthenticationFailed(f"peer {_peer(sock)} asked for a {admitted.purpose!r} channel, not {purpose!r}")
    return admitted.device, admitted.channel


def join_home(sock: socket.socket, secret: bytes, device: int, purpose: str = CONTROL) -> SealedSocket:
    """Connector side: answer the challenge as ``device`` for ``purpose``, check the acceptor's proof in turn."""
    challenge, _ = recv_message(sock, authenticated=False)
    if challenge.get("type") != "challenge":
        raise AuthenticationFailed("the portal did not open with a challenge")
    acceptor_nonce = str(challenge["nonce"])
    connector_nonce = secrets.token_hex(NONCE_BYTES)
    send_message(
        sock,
        {
            "type": "hello",
            "device": device,
            "purpose": purpose,
            "nonce": connector_nonce,
            "mac": _mac(secret, "device", acceptor_nonce, connector_nonce, device, purpose),
        },
    )
    answer, _ = recv_message(sock, authenticated=False)
    if answer.get("type") != "welcome":
        raise AuthenticationFailed(f"the portal rejected device {device}: wrong home secret")
    expected = _mac(secret, "portal", connector_nonce, acceptor_nonce, device, purpose)
    if not hmac.compare_digest(str(answer.get("mac")), expected):
        raise AuthenticationFailed("the portal failed to prove the home secret")
    try:
        return _sealed(sock, secret, acceptor_nonce, connector_nonce, device, purpose, False)
    except ValueError:
        raise AuthenticationFailed("the portal sent a malformed challenge") from None


def _peer(sock: socket.socket) -> str:
    try:
        address = sock.getpeername()
    except OSError:
        return "(disconnected)"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else repr(address or "(local socket)")
