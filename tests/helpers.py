"""What many tests need, defined once: polling for a condition, free loopback ports, a home's secret, the
cgroups marker, and workers' epoch meshes on loopback. (Finding the processes a test started is
:mod:`processes`; pipelines to test, :mod:`pipeline_kit`.)"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

import pytest

from ecofl.cgroups import find_hierarchy
from ecofl.net.mesh import DataListener, EpochMesh

#: The home secret of every test home (32 bytes, as ``ecofl.net.auth.new_secret`` makes them).
SECRET = bytes(range(32))

#: Where cgroup v2 can be written here, or why not; tests that confine devices skip with that reason.
CGROUPS = find_hierarchy()
needs_cgroups = pytest.mark.skipif(isinstance(CGROUPS, str), reason=f"cgroups not writable here: {CGROUPS}")


def wait_for(condition: Callable[[], object], timeout_s: float = 60.0, poll_s: float = 0.02,
             what: str = "condition") -> float:
    """Poll ``condition`` until it is true; the seconds it took. AssertionError naming ``what`` after
    ``timeout_s`` (bound it generously: a loaded machine is slow, and a test asserts what happened, not when)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what} not met within {timeout_s:.0f} s")
        time.sleep(poll_s)
    return time.monotonic() - start


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (all held until all are found, so that none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def holds_for(condition: Callable[[], object], seconds: float, poll_s: float = 0.02,
              what: str = "condition") -> None:
    """A negative check over a window: ``condition`` is true at every poll for ``seconds`` (AssertionError at
    the first poll where it is not, rather than one look after a fixed sleep)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert condition(), f"{what} broke after {seconds - (end - time.monotonic()):.2f} s"
        time.sleep(poll_s)
    assert condition(), f"{what} broke at the end of {seconds:.2f} s"


def answer_of(sock: socket.socket) -> object:
    """What the other end says next on ``sock``: a message's header, or ``"closed"`` if it hangs up without a
    word (a door closes a stranger's connection so, read or unread)."""
    from ecofl.net.errors import ChannelClosed
    from ecofl.net.wire import recv_message

    try:
        return recv_message(sock)[0]
    except (ChannelClosed, ConnectionResetError, BrokenPipeError):
        return "closed"


def meshes(n: int, epoch: int = 0) -> tuple[list[DataListener], list[EpochMesh]]:
    """``n`` workers' listeners and their epoch meshes, built concurrently (as workers do)."""
    listeners = [DataListener("127.0.0.1", SECRET) for _ in range(n)]
    addresses = [listener.address for listener in listeners]
    built: dict[int, EpochMesh] = {}
    threads = [threading.Thread(target=lambda r=r: built.__setitem__(
        r, EpochMesh(listeners[r], SECRET, epoch, r, addresses, timeout_s=30))) for r in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(built) == list(range(n))
    return listeners, [built[r] for r in range(n)]


def close_all(listeners: list[DataListener], meshes_: list[EpochMesh]) -> None:
    """Close ``meshes_``, then their workers' ``listeners``."""
    for mesh in meshes_:
        mesh.close()
    for listener in listeners:
        listener.close()
