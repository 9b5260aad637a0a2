"""The portal's side of the control protocol: wait for one reply from each worker, watching for failures.

While it waits, the portal checks three signs of a lost device: the
heartbeat monitor's failures (a frozen or cut-off device, Asteroid §3.4), a
control channel that closes (a killed or crashed process), and a local
worker process that exited. With fault tolerance these become
:class:`~ecofl.pipeline.runtime.errors.DevicesLost` (the pipeline recovers);
without, the root cause of the failure (:mod:`.failures`). A worker whose
sync-round was interrupted by a lost peer answers ``interrupted`` and is
simply waited past: the failure that caused it is about to be detected. A
device whose phase-targeted trap fires says ``trapped`` first
(:mod:`.traps`); the portal notes when, and waits on.

:func:`interrupt` is a recovery's first step: every survivor stops whatever
it is doing and answers with the committed copies it holds.
"""

from __future__ import annotations

import selectors
import time
from typing import TYPE_CHECKING, Any, Sequence

from ecofl.net.errors import ChannelClosed
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.runtime.errors import DevicesLost, WorkerFailed, WorkerTimeout

if TYPE_CHECKING:
    from ecofl.pipeline.runtime.portal import HomePipeline


def gather(
    pipeline: "HomePipeline", expected: str, with_arrays: bool = False, devices: Sequence[int] | None = None,
) -> dict[int, dict[str, Any]]:
    """One reply of type ``expected`` from every worker (or from ``devices``)."""
    waiting = set(pipeline.connections if devices is None else devices)
    replies: dict[int, dict[str, Any]] = {}
    interrupted: dict[int, str] = {}  # device -> why its sync-round stopped (a peer was lost)
    deadline = time.time() + pipeline.timeout_s
    with selectors.DefaultSelector() as selector:
        for device in waiting:
            selector.register(pipeline.connections[device], selectors.EVENT_READ, device)
        while waiting - set(replies):
            check_lost(pipeline, f"waiting for {expected!r}")
            if time.time() > deadline:
                late = ", ".join(f"{d} ({pipeline.name(d)})" for d in sorted(waiting - set(replies) - set(interrupted)))
                why = "".join(f"; device {d} stopped: {reason}" for d, reason in sorted(interrupted.items()))
                raise WorkerTimeout(f"device(s) {late or 'none'} did not answer {expected!r} within "
                                    f"{pipeline.timeout_s:.0f} s{why}")
            for key, _ in selector.select(timeout=0.05):
                device = key.data
                sock = pipeline.connections[device]
                message = _next_message(pipeline, device, deadline)
                if message is None:
                    raise pipeline.failure(device, None, f"waiting for {expected!r}")
                header, arrays = message
                kind = header.get("type")
                if kind == "trapped":
                    continue
                if kind == "error":
                    raise pipeline.failure(device, header, f"waiting for {expected!r}")
                if kind == "interrupted":
                    interrupted[device] = str(header.get("reason"))
                    selector.unregister(sock)  # waits for the lost device to be named
                    continue
                if kind != expected:
                    raise WorkerFailed(f"device {device} answered {kind!r}, expected {expected!r}")
                if with_arrays:
                    header["arrays"] = arrays
                replies[device] = header
                selector.unregister(sock)
    return replies


def check_lost(pipeline: "HomePipeline", during: str) -> None:
    """Raise if a device is known to be lost: failed heartbeats, or a worker process that exited."""
    if pipeline.monitor is not None:
        failures = {d: f.reason for d, f in pipeline.monitor.failures().items() if d in pipeline.connections}
        if failures:
            raise DevicesLost(failures)
    for device, code in pipeline.devices.exited().items():
        if code != 0 and device in pipeline.connections:
            raise pipeline.failure(device, None, during)


def interrupt(pipeline: "HomePipeline", devices: Sequence[int], token: int
              ) -> tuple[dict[int, dict[str, Any]], set[int]]:
    """Send ``abort`` (``token``) to ``devices`` and wait until each answers it: their ``interrupted`` replies
    (with their holdings), and the devices that cannot answer (a closed channel, a process that exited, failed
    heartbeats, no answer within the timeout). Replies sent before the abort are passed over."""
    unreachable: set[int] = set()
    for device in devices:
        try:
            send_message(pipeline.connections[device], {"type": "abort", "token": token})
        except OSError:
            unreachable.add(device)
    waiting = set(devices) - unreachable
    replies: dict[int, dict[str, Any]] = {}
    deadline = time.time() + pipeline.timeout_s
    with selectors.DefaultSelector() as selector:
        for device in waiting:
            selector.register(pipeline.connections[device], selectors.EVENT_READ, device)
        while waiting:
            gone = set(pipeline.monitor.failures()) if pipeline.monitor is not None else set()
            gone |= {d for d, code in pipeline.devices.exited().items() if code != 0}
            if time.time() > deadline:
                gone |= waiting
            for device in gone & waiting:
                selector.unregister(pipeline.connections[device])
                waiting.discard(device)
                unreachable.add(device)
            for key, _ in selector.select(timeout=0.05) if waiting else ():
                device = key.data
                sock = pipeline.connections[device]
                message = _next_message(pipeline, device, deadline)
                header = None if message is None else message[0]
                if header is not None and header.get("type") == "trapped":
                    continue
                if header is None or header.get("type") == "error":
                    unreachable.add(device)
                elif header.get("type") == "interrupted" and header.get("token") == token:
                    replies[device] = header
                else:
                    continue  # an answer to a request from before the abort
                selector.unregister(sock)
                waiting.discard(device)
    return replies, unreachable


def _next_message(pipeline: "HomePipeline", device: int, deadline: float) -> tuple[dict, dict] | None:
    """The next message on ``device``'s control channel (None: the channel closed); a trap's notice is noted in
    ``pipeline.trapped`` (when it struck) and returned as is."""
    sock = pipeline.connections[device]
    sock.settimeout(max(1.0, deadline - time.time()))
    try:
        header, arrays = recv_message(sock)
    except (ChannelClosed, OSError):
        return None
    finally:
        sock.settimeout(None)
    if header.get("type") == "trapped":
        pipeline.trapped[device] = float(header["time"])
    return header, arrays
