"""Which worker failed first: the root cause of a failure the portal cannot recover from.

One worker's death or error makes its neighbours fail too, and their reports
may arrive first. After a short grace the portal collects what every worker
has said: a worker gone without a word (killed, crashed, unplugged) is the
cause; otherwise the earliest reported error is.
"""

from __future__ import annotations

import selectors
import socket
import subprocess
import time
from typing import Any, Callable

from ecofl.net.errors import ChannelClosed
from ecofl.net.wire import recv_message
from ecofl.pipeline.runtime.errors import EmulatedOOM, HomePipelineError, WorkerDied, WorkerFailed
from ecofl.pipeline.runtime.launch import LocalDevices


def root_cause(
    device: int, report: dict[str, Any] | None, during: str, connections: dict[int, socket.socket],
    devices: LocalDevices, name: Callable[[int], str],
) -> HomePipelineError:
    """The error to raise for a failure first noticed at ``device`` (``report``: its error message)."""
    time.sleep(0.5)
    reports: dict[int, dict[str, Any]] = {}
    silent: list[int] = []
    for other, sock in connections.items():
        if other == device and report is not None:
            reports[other] = report
            continue
        state, header = pending_error(sock)
        if state == "error":
            reports[other] = header
        elif state == "closed" or devices.exited().get(other, 0) != 0:
            silent.append(other)
    if report is None and device not in reports and device not in silent:
        silent.insert(0, device)  # exited before it ever connected
    if silent:
        gone = silent[0] if device not in silent else device
        return WorkerDied(death_notice(gone, during, devices, name) + _echoes(reports, name))
    first, header = min(reports.items(), key=lambda item: item[1].get("time", float("inf")))
    if header.get("kind") == "EmulatedOOM":
        return EmulatedOOM(str(header.get("message")))
    return WorkerFailed(f"device {first} ({name(first)}) failed: {header.get('kind')}: {header.get('message')}")


def death_notice(device: int, during: str, devices: LocalDevices, name: Callable[[int], str]) -> str:
    code = None
    process = devices.processes.get(device)
    if process is not None:
        try:
            code = process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            code = None  # still running: only its connection broke
    detail = f" (exit code {code})" if code is not None else ""
    tail = devices.log_tail(device)
    log = f"; its last output: {tail}" if tail else ""
    return f"device {device} ({name(device)}) went away{detail} while {during}{log}"


def pending_error(sock: socket.socket) -> tuple[str, dict[str, Any] | None]:
    """Read what a worker has already sent: ("error", header), ("closed", None) or ("quiet", None)."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while selector.select(timeout=0):
            sock.settimeout(1.0)
            try:
                header, _ = recv_message(sock)
            except (ChannelClosed, OSError, ValueError):
                return "closed", None
            if header.get("type") == "error":
                return "error", header
    return "quiet", None


def _echoes(reports: dict[int, dict[str, Any]], name: Callable[[int], str]) -> str:
    if not reports:
        return ""
    said = "; ".join(f"device {d} ({name(d)}) reported {h.get('kind')}: {h.get('message')}" for d, h in reports.items())
    return f" (then {said})"
