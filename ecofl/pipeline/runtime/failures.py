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
from typing import Callable

from ecofl.pipeline.runtime.control_messages import REPLIES, Error
from ecofl.pipeline.runtime.errors import DeviceOutOfMemory, EmulatedOOM, HomePipelineError, WorkerDied, WorkerFailed
from ecofl.pipeline.runtime.launch import LocalDevices
from ecofl.net.errors import ChannelClosed
from ecofl.net.wire import recv_message


def root_cause(
    device: int, report: Error | None, during: str, connections: dict[int, socket.socket],
    devices: LocalDevices, name: Callable[[int], str],
) -> HomePipelineError:
    """The error to raise for a failure first noticed at ``device`` (``report``: its error message)."""
    time.sleep(0.5)
    reports: dict[int, Error] = {}
    silent: list[int] = []
    for other, sock in connections.items():
        if other == device and report is not None:
            reports[other] = report
            continue
        state, error = pending_error(sock)
        if state == "error":
            reports[other] = error
        elif state == "closed" or devices.exited().get(other, 0) != 0:
            silent.append(other)
    if report is None and device not in reports and device not in silent:
        silent.insert(0, device)  # exited before it ever connected
    if silent:
        gone = silent[0] if device not in silent else device
        error = DeviceOutOfMemory if devices.out_of_memory(gone) else WorkerDied
        return error(death_notice(gone, during, devices, name) + _echoes(reports, name))
    first, error = min(reports.items(), key=lambda item: item[1].time)
    if error.kind == "EmulatedOOM":
        return EmulatedOOM(error.message)
    return WorkerFailed(f"device {first} ({name(first)}) failed: {error.kind}: {error.message}")


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
    if devices.out_of_memory(device):
        budget = devices.confinement.limits[device].memory_bytes
        limit = devices.confinement.groups[device].memory_limit_bytes
        return (f"device {device} ({name(device)}) ran out of memory while {during}: the kernel killed its worker "
                f"at its cgroup's limit of {limit / 2**20:.0f} MiB (its budget of {budget / 2**20:.0f} MiB and "
                f"the runtime){detail}{log}")
    return f"device {device} ({name(device)}) went away{detail} while {during}{log}"


def pending_error(sock: socket.socket) -> tuple[str, Error | None]:
    """Read what a worker has already sent: ("error", its report), ("closed", None) or ("quiet", None)."""
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        while selector.select(timeout=0):
            sock.settimeout(1.0)
            try:
                header, _ = recv_message(sock)
                reply = REPLIES.decode(header)
            except (ChannelClosed, OSError, ValueError):
                return "closed", None
            if isinstance(reply, Error):
                return "error", reply
    return "quiet", None


def _echoes(reports: dict[int, Error], name: Callable[[int], str]) -> str:
    if not reports:
        return ""
    said = "; ".join(f"device {d} ({name(d)}) reported {e.kind}: {e.message}" for d, e in reports.items())
    return f" (then {said})"
