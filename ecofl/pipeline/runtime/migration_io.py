"""Moving stage state between devices over the epoch's tensor links: replicas and layer migration.

Every move of a re-plan, and every replica, is a list of tensors sent
point-to-point from the device that holds them to the device that needs
them, all posted at once so that the moves of different device pairs run
concurrently (Asteroid §3.4: "concurrent layer migration between adjacent
stages"; FTPipeHD Algorithm 1 fetches each missing layer from the worker
that has it). Both ends list the tensors of a layer in the same (sorted key)
order, so the tensors of one tag arrive in the order the receiver expects.
With a link rate the sender paces its bytes like the pipeline's own sends
(emulated links).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ecofl.net.links import AbortCheck, never_aborted
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket


def exchange_states(
    mesh: EpochMesh,
    sends: list[tuple[int, list[torch.Tensor]]],
    receives: list[tuple[int, list[torch.Tensor]]],
    tag: int,
    rate_bps: float | None = None,
    abort: AbortCheck = never_aborted,
    posted: Callable[[], None] = lambda: None,
) -> int:
    """Post every send (to a rank), fill every receive (from a rank, into the given buffers); wait for all.

    Returns the bytes received. A received tensor whose shape or dtype
    differs from its buffer's is an error (the two ends disagree on the plan).
    Every wait checks ``abort``; ``posted()`` is called once the sends are
    posted (a phase point, :mod:`.traps`). Buffers of an exchange that did
    not finish hold partial data: the caller keeps them only on success.
    """
    bucket = TokenBucket(rate_bps) if rate_bps else None
    tickets = [mesh.send(dst, tensor, tag, bucket) for dst, tensors in sends for tensor in tensors]
    posted()
    for src, buffers in receives:
        for buffer in buffers:
            received = mesh.recv(src, tag, abort=abort)
            if received.shape != buffer.shape or received.dtype != buffer.dtype:
                raise ValueError(f"rank {src} sent a {received.dtype} {tuple(received.shape)} tensor where "
                                 f"{buffer.dtype} {tuple(buffer.shape)} was expected")
            with torch.no_grad():
                buffer.copy_(received)
    for ticket in tickets:
        ticket.wait(mesh.timeout_s, abort, "moving stage state between devices")
    return sum(b.numel() * b.element_size() for _, buffers in receives for b in buffers)


def pace(nbytes: int, rate_bps: float | None) -> None:
    """Take as long as ``nbytes`` need on an emulated link of ``rate_bps`` (no link: return at once)."""
    if rate_bps:
        TokenBucket(rate_bps, burst_bytes=0).consume(nbytes)


def exchange_layer_states(mesh: EpochMesh, sends: list[tuple[int, dict[str, torch.Tensor]]],
                          receives: list[tuple[int, dict[str, torch.Tensor]]], tag: int, rate_bps: float | None,
                          abort: AbortCheck, posted: Callable[[], None]) -> int:
    """:func:`exchange_states` of states by key (to or from a rank): their tensors in key order at both ends."""
    return exchange_states(mesh, [(rank, [s[k] for k in sorted(s)]) for rank, s in sends],
                           [(rank, [b[k] for k in sorted(b)]) for rank, b in receives], tag, rate_bps, abort, posted)
