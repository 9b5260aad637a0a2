"""A stranger on a home's network: the attacks of tests/test_strangers.py, and a peer with the secret timing its
admission. A stranger knows no knock (ecofl.net.knock): what it sends goes where a knock belongs. Its own module,
so that an attacker run in another network namespace imports it alone."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from contextlib import ExitStack

from ecofl.net.auth import CONTROL, join_home
from ecofl.net.knock import knock_frame
from ecofl.net.wire import recv_message
from helpers import SECRET, answer_of


def stranger(n: int) -> str:
    """The n-th attacker address (1 -> 127.0.0.2): loopback, but not the home's own."""
    return f"127.0.{n // 250}.{n % 250 + 2}"


def connect_from(address: tuple[str, int], source: str, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.bind((source, 0))
        sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


def frame(body: bytes) -> bytes:
    return struct.pack(">Q", len(body)) + body


def hello(**fields) -> bytes:
    claim = {"type": "hello", "device": 1, "purpose": CONTROL, "nonce": "00" * 32, "mac": "00" * 32, **fields}
    return frame(json.dumps(claim).encode())


MALFORMED = {
    "device 1e400": frame(b'{"type": "hello", "device": 1e400, "purpose": "control", "nonce": "' + b"0" * 64
                          + b'", "mac": "' + b"0" * 64 + b'"}'),
    "2000 nested brackets": frame(b"[" * 2000),
    "negative device": hello(device=-1),
    "huge device": hello(device=10**30),
    "device NaN": frame(b'{"type": "hello", "device": NaN}'),
    "device as text": hello(device="1"),
    "length prefix 2**63": struct.pack(">Q", 2**63),
    "oversized header": frame(b" " * 5000),
    "not UTF-8": frame(b'{"type": "\xff\xfe"}'),
    "garbage": b"\xff" * 64,
}


def send_malformed(address: tuple[str, int], source: str, payload: bytes, knock_for: str | None = None) -> object:
    """Send ``payload`` where a hello belongs: what the door answers ("closed" when it hangs up without a word).

    A stranger sends it at once and ends its side; a peer that holds the secret (a member with a bug) knocks
    for ``knock_for``, reads the challenge and then sends it.
    """
    knock = knock_for is not None
    with connect_from(address, source, timeout=15) as sock:
        if knock:
            sock.sendall(knock_frame(SECRET, knock_for))
            challenge, _ = recv_message(sock)
            assert set(challenge) == {"type", "nonce"}
        try:
            sock.sendall(payload)
            if not knock:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            return "closed"
        return answer_of(sock)


def legit_join(address: tuple[str, int], purpose: str, device: int = 9, source: str | None = None) -> float:
    """Seconds a peer with the secret (from ``source``) takes to be admitted at ``address`` (it then leaves):
    what :func:`ecofl.net.dial.dial` does, from a chosen address."""
    start = time.monotonic()
    with socket.create_connection(address, timeout=10, source_address=(source, 0) if source else None) as sock:
        sock.sendall(knock_frame(SECRET, purpose))
        join_home(sock, SECRET, device, purpose).close()
    return time.monotonic() - start


# -- attacks -------------------------------------------------------------------------------


class Attacker:
    """The attacks, each for ``seconds`` against one address; every socket closed when it ends."""

    def __init__(self, first_source: int = 1, only_from: str | None = None):
        self.next_source, self.only_from = first_source, only_from

    def sources(self, count: int) -> list[str]:
        """``count`` addresses of the attacker's own (all the same one for an attacker ``only_from`` one)."""
        if self.only_from is not None:
            return [self.only_from] * count
        sources = [stranger(self.next_source + i) for i in range(count)]
        self.next_source += count
        return sources

    def trickle(self, address, seconds: float, connections: int = 1, sources: int = 1,
                reconnect: bool = False) -> None:
        """``connections`` connections from ``sources`` addresses, each sending a byte every half second (a
        hello, where a knock belongs); with ``reconnect``, one the door closes is opened again at once."""
        addresses = self.sources(sources)
        with ExitStack() as stack:
            socks: dict[socket.socket, str] = {}

            def open_from(source: str) -> None:
                try:
                    socks[stack.enter_context(connect_from(address, source, timeout=2))] = source
                except OSError:
                    pass  # a full backlog: the flood goes on with the connections it has

            for i in range(connections):
                open_from(addresses[i % sources])
            payload = hello(purpose="x" * 3000)
            end, offset = time.monotonic() + seconds, 0
            while time.monotonic() < end:
                for sock, source in list(socks.items()):
                    try:
                        sock.send(payload[offset % len(payload):offset % len(payload) + 1])
                    except OSError:  # the door hung up (its deadline, or beyond its bounds)
                        del socks[sock]
                        sock.close()
                        if reconnect:
                            open_from(source)
                offset += 1
                time.sleep(0.5)

    def silent(self, address, seconds: float, connections: int = 100, sources: int = 1) -> None:
        """``connections`` connections from ``sources`` addresses that say nothing."""
        addresses = self.sources(sources)
        with ExitStack() as stack:
            for i in range(connections):
                try:
                    stack.enter_context(connect_from(address, addresses[i % sources], timeout=2))
                except OSError:
                    pass
            time.sleep(seconds)

    def malformed(self, address, knock_for: str | None = None) -> dict[str, object]:
        """Every malformed hello, each from an address of its own (after a right knock for ``knock_for``): the
        answers."""
        return {what: send_malformed(address, source, payload, knock_for)
                for (what, payload), source in zip(MALFORMED.items(), self.sources(len(MALFORMED)))}


def attack_every_port(ports: dict[str, tuple[tuple[str, int], str]], heartbeat_s: float, other_s: float,
                      attacker: Attacker, legit_from: str | None = None) -> list[dict]:
    """Each attack against each port in turn; during and after each, a peer with the secret (from
    ``legit_from``) is admitted: how long each admission took."""
    admissions = []
    for name, (address, purpose) in ports.items():
        seconds = heartbeat_s if name == "heartbeat" else other_s
        attacks = {
            "trickle": lambda: attacker.trickle(address, seconds),
            "100 silent": lambda: attacker.silent(address, seconds),
            "malformed": lambda: attacker.malformed(address),
            "flood of 200 trickling": lambda: attacker.trickle(address, seconds, connections=200, sources=10),
            "100 reconnecting tricklers from 100 addresses": lambda: attacker.trickle(
                address, seconds, connections=100, sources=100, reconnect=True),
        }
        for attack, run in attacks.items():
            attacking = threading.Thread(target=run)
            attacking.start()
            try:
                time.sleep(0.5)  # under way (a peer that joins now once waited for a trickler to finish)
                during_s = legit_join(address, purpose, source=legit_from)
            finally:
                attacking.join()
            after_s = legit_join(address, purpose, source=legit_from)
            admissions.append({"port": name, "attack": attack, "during_s": during_s, "after_s": after_s})
    return admissions
