"""The devices joined to a home now: names as identities, presence from their daemons' beats.

Every device of a home holds the home's secret, so the secret alone cannot
tell two devices apart; its name does. A registration under the name of a
device that is joined and beating is refused (the daemon is told so and
tries again later): a plan never holds two devices of one name, and a second
daemon started under a name by mistake cannot take over a live device. A
device silent for the service's beat timeout (:meth:`Liveness.suspected`) is
already left out of plans; a registration under its name replaces it (its
daemon restarted, or its machine froze), and its channel is closed.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

from ecofl.deploy.service_messages import DAEMON_BEAT_S, Bye, Register, Registered, Session
from ecofl.devices import DeviceSpec
from ecofl.net.liveness import Liveness, LivenessSettings
from ecofl.net.schema import encode
from ecofl.net.sealed import SealedSocket
from ecofl.net.wire import send_message


@dataclass
class Member:
    """A device joined right now."""

    id: int
    spec: DeviceSpec
    registration: Register
    sock: SealedSocket
    joined_at: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one writer on the socket at a time

    def send(self, message: Registered | Session | Bye) -> None:
        with self.lock:
            send_message(self.sock, encode(message))


class Registry:
    """The home's members (thread-safe): who joined, who beats, who holds which name (module docstring)."""

    def __init__(self, beat_timeout_s: float):
        self.members: dict[int, Member] = {}
        self.names_refused = 0  # registrations refused: a device of that name was joined and beating
        self._beats = Liveness((), LivenessSettings(DAEMON_BEAT_S, beat_timeout_s, beat_timeout_s), time.monotonic())
        self._next_id = 1
        self._lock = threading.Lock()

    def join(self, spec: DeviceSpec, registration: Register, sock: SealedSocket
             ) -> tuple[Member | None, Member | None]:
        """Admit a registration: ``(member, replaced)``, the new member and the silent one it replaced (closed
        here); ``(None, holder)`` when ``holder``, joined and beating, has the name."""
        with self._lock:
            now = time.monotonic()
            holder = next((m for m in self.members.values() if m.spec.name == spec.name), None)
            if holder is not None and holder.id not in self._beats.suspected(now):
                self.names_refused += 1
                return None, holder
            if holder is not None:
                self._forget(holder.id)
            member = Member(self._next_id, spec, registration, sock)
            self._next_id += 1
            self.members[member.id] = member
            self._beats.join(member.id, now)
        if holder is not None:
            try:
                holder.sock.shutdown(socket.SHUT_RDWR)  # its serving thread ends
            except OSError:
                pass
        return member, holder

    def heard(self, member: Member) -> None:
        with self._lock:
            self._beats.heard(member.id, time.monotonic())

    def leave(self, member: Member) -> None:
        with self._lock:
            self._forget(member.id)

    def present(self) -> list[Member]:
        """The devices joined now, in joining order, but for the silent ones."""
        with self._lock:
            silent = self._beats.suspected(time.monotonic())
            return [m for m in sorted(self.members.values(), key=lambda m: m.id) if m.id not in silent]

    def everyone(self) -> list[Member]:
        """Every member, silent or not."""
        with self._lock:
            return list(self.members.values())

    def holds(self, member_id: int) -> bool:
        with self._lock:
            return member_id in self.members

    def _forget(self, member_id: int) -> None:
        self.members.pop(member_id, None)
        self._beats.leave(member_id)
