"""A device joins a home only with the home's secret: mutual HMAC challenge-response.

Runs on the control channel before anything else (no rendezvous address, no
model, no tensor is revealed or accepted first)::

    portal -> device   {"type": "challenge", "nonce": Np}
    device -> portal   {"type": "hello", "device": d, "nonce": Nd, "mac": HMAC(k, "device" | Np | Nd | d)}
    portal -> device   {"type": "welcome", "mac": HMAC(k, "portal" | Nd | Np | d)}   or {"type": "rejected"}

Both sides compare MACs in constant time; fresh 32-byte nonces on both sides
stop replays, and the portal's MAC stops a device from following a portal
that does not hold the secret. HMAC-SHA256 (RFC 2104).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket

from ecofl.pipeline.runtime.errors import AuthenticationFailed
from ecofl.pipeline.runtime.wire import recv_message, send_message

NONCE_BYTES = 32


def new_secret() -> bytes:
    """A fresh random home secret."""
    return secrets.token_bytes(32)


def _mac(secret: bytes, role: str, first: str, second: str, device: int) -> str:
    message = f"{role}|{first}|{second}|{device}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def admit_device(sock: socket.socket, secret: bytes) -> int:
    """Portal side: challenge the peer on ``sock``; return its device index once it proves the secret.

    Raises :class:`AuthenticationFailed` (after telling the peer) if it does not.
    """
    portal_nonce = secrets.token_hex(NONCE_BYTES)
    send_message(sock, {"type": "challenge", "nonce": portal_nonce})
    hello, _ = recv_message(sock, authenticated=False)
    try:
        device = int(hello["device"])
        device_nonce = str(hello["nonce"])
        claimed = str(hello["mac"])
    except (KeyError, TypeError, ValueError):
        raise AuthenticationFailed(f"peer {_peer(sock)} sent a malformed hello") from None
    if hello.get("type") != "hello" or len(device_nonce) != 2 * NONCE_BYTES:
        raise AuthenticationFailed(f"peer {_peer(sock)} sent a malformed hello")
    if not hmac.compare_digest(claimed, _mac(secret, "device", portal_nonce, device_nonce, device)):
        send_message(sock, {"type": "rejected"})
        raise AuthenticationFailed(f"peer {_peer(sock)} claiming device {device} failed authentication")
    send_message(sock, {"type": "welcome", "mac": _mac(secret, "portal", device_nonce, portal_nonce, device)})
    return device


def join_home(sock: socket.socket, secret: bytes, device: int) -> None:
    """Device side: answer the portal's challenge and check the portal's proof in turn."""
    challenge, _ = recv_message(sock, authenticated=False)
    if challenge.get("type") != "challenge":
        raise AuthenticationFailed("the portal did not open with a challenge")
    portal_nonce = str(challenge["nonce"])
    device_nonce = secrets.token_hex(NONCE_BYTES)
    send_message(
        sock,
        {
            "type": "hello",
            "device": device,
            "nonce": device_nonce,
            "mac": _mac(secret, "device", portal_nonce, device_nonce, device),
        },
    )
    answer, _ = recv_message(sock, authenticated=False)
    if answer.get("type") != "welcome":
        raise AuthenticationFailed(f"the portal rejected device {device}: wrong home secret")
    if not hmac.compare_digest(str(answer.get("mac")), _mac(secret, "portal", device_nonce, portal_nonce, device)):
        raise AuthenticationFailed("the portal failed to prove the home secret")


def _peer(sock: socket.socket) -> str:
    try:
        address = sock.getpeername()
    except OSError:
        return "(disconnected)"
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else repr(address or "(local socket)")
