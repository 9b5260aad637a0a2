"""The knock: a connection's first bytes prove the home's secret before a door gives it anything.

A stranger on the home network can open as many connections as it has
addresses, and the challenge-response handshake (:mod:`.auth`) holds a
thread and a place for each until its deadline. So every connector first
sends one frame of fixed size, unasked, the moment it has connected
(:func:`knock_frame`, sent by :func:`~ecofl.net.dial.dial`)::

    "EFK1" | nonce (16 random bytes) | purpose (64 bytes, NUL-padded) | HMAC(k_knock, all before)

with ``k_knock = HMAC(secret, "ecofl knock")`` (so a knock's MAC never
equals a handshake's). A door reads it on its accepting thread, with no
thread and no handshake place for the peer (:class:`~ecofl.net.door.Door`),
and lets only a peer whose knock is right into the handshake: strangers
never queue where members do. Like TCP's SYN cookies and WireGuard's MAC1,
the knock is cheap to check (one HMAC) and needs no round trip. A door
answers nothing to anything but a knock under another secret, which it
answers ``rejected`` (a member set up with the wrong secret is told so at
once, :func:`~ecofl.net.auth.join_home`).

Replays. An eavesdropper on the home network can copy a member's knock and
send it again. Every door of a process records the nonces of the knocks it
accepted (:class:`KnockLedger`, the last :data:`LEDGER_NONCES`), and a nonce
seen before is refused; a replayed knock gets in only at a process that
started after the original, and then once, into a handshake it cannot
complete (the handshake's own nonces stop it). No clocks are compared: the
devices of a home (Raspberry Pis without a real-time clock) need not agree
on the time. The purpose is bound too: a knock for ``"heartbeat"`` opens no
control port.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
from collections import OrderedDict

from ecofl.net.errors import AuthenticationFailed

MAGIC = b"EFK1"
NONCE_BYTES = 16
PURPOSE_BYTES = 64
MAC_BYTES = 32
KNOCK_BYTES = len(MAGIC) + NONCE_BYTES + PURPOSE_BYTES + MAC_BYTES
KNOCK_DEADLINE_S = 3.0  # from accepting a connection to its whole knock (a member sends it at once)
LEDGER_NONCES = 65_536  # knocks remembered per process (16 bytes each)
PURPOSE = re.compile("[a-z0-9 ]{1,64}")  # what a purpose may be (also checked in the hello, auth.Hello)


def _key(secret: bytes) -> bytes:
    return hmac.new(secret, b"ecofl knock", hashlib.sha256).digest()


def knock_frame(secret: bytes, purpose: str) -> bytes:
    """The first bytes a connector sends: a fresh nonce and ``purpose`` under the home's MAC."""
    if not PURPOSE.fullmatch(purpose):
        raise ValueError(f"a purpose is 1-64 of a-z, 0-9 and space, got {purpose!r}")
    body = MAGIC + secrets.token_bytes(NONCE_BYTES) + purpose.encode().ljust(PURPOSE_BYTES, b"\0")
    return body + hmac.new(_key(secret), body, hashlib.sha256).digest()


class WrongSecret(AuthenticationFailed):
    """A knock of the right form under another secret: a device of another home, or one set up wrong."""


class KnockLedger:
    """The nonces of the last ``capacity`` knocks accepted in this process (thread-safe)."""

    def __init__(self, capacity: int = LEDGER_NONCES):
        self.capacity = capacity
        self._nonces: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def first_time(self, nonce: bytes) -> bool:
        """Record ``nonce``; False if it was recorded before (a replay)."""
        with self._lock:
            if nonce in self._nonces:
                return False
            self._nonces[nonce] = None
            if len(self._nonces) > self.capacity:
                self._nonces.popitem(last=False)
            return True


PROCESS_LEDGER = KnockLedger()  # shared by every door of the process: a per-round door is new each round


def check_knock(frame: bytes, secret: bytes, ledger: KnockLedger = PROCESS_LEDGER) -> str:
    """The purpose of a right knock; :class:`AuthenticationFailed` (why) for any other ``frame``."""
    if len(frame) != KNOCK_BYTES or not frame.startswith(MAGIC):
        raise AuthenticationFailed("sent no knock")
    body, mac = frame[:-MAC_BYTES], frame[-MAC_BYTES:]
    if not hmac.compare_digest(mac, hmac.new(_key(secret), body, hashlib.sha256).digest()):
        raise WrongSecret("knocked without the home's secret")
    purpose = body[len(MAGIC) + NONCE_BYTES:].rstrip(b"\0").decode("ascii", errors="replace")
    if not PURPOSE.fullmatch(purpose):  # a member's bug: the MAC holds, the purpose is no purpose
        raise AuthenticationFailed("knocked for no valid purpose")
    if not ledger.first_time(body[len(MAGIC):len(MAGIC) + NONCE_BYTES]):
        raise AuthenticationFailed("replayed a knock")
    return purpose
