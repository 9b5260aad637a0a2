"""Moving stage state between devices over the epoch's tensor links: a re-plan's layer migration.

Every move of a re-plan is the state of some layers sent point-to-point from
the device that holds them to the device that needs them, all posted at once
so that the moves of different device pairs run concurrently (Asteroid §3.4:
"concurrent layer migration between adjacent stages"; FTPipeHD Algorithm 1
fetches each missing layer from the worker that has it). The layers a device
sends to another travel as one stream of bytes (:mod:`.byte_stream`, as
replicas do), both ends listing the tensors in one order: with a
message per tensor, a kill of the last device of Eco-FL's confined testbed
spent about a second moving 3.3 MB that the link carries in a quarter of
one. With a link rate the sender paces its bytes like the pipeline's own
sends (emulated links).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from ecofl.net.links import AbortCheck, never_aborted
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.byte_stream import in_stream_order, opened_in_place, receive_stream, send_stream

LayerStates = list[tuple[int, dict[str, torch.Tensor]]]  # (rank, a state by key) to send, or buffers to fill


def exchange_layer_states(mesh: EpochMesh, sends: LayerStates, receives: LayerStates, tag: int,
                          rate_bps: float | None = None, abort: AbortCheck = never_aborted,
                          posted: Callable[[], None] = lambda: None) -> int:
    """Post every send (a state, to a rank), fill every receive (buffers by key, from a rank); wait for all.

    Returns the bytes received. A piece that does not fit what the
    receiver expects is an error (the two ends disagree on the plan). Every
    wait checks ``abort``; ``posted()`` is called once the sends are posted
    (a phase point, :mod:`.traps`). Buffers of an exchange that did not
    finish hold partial data: the caller keeps them only on success.
    """
    bucket = TokenBucket(rate_bps) if rate_bps else None
    with opened_in_place(mesh, [(rank, in_stream_order(buffers)) for rank, buffers in receives], tag):
        tickets = [ticket for rank, state in sends
                   for ticket in send_stream(mesh, rank, in_stream_order(state), tag, bucket)]
        posted()
        for rank, buffers in receives:
            receive_stream(mesh, rank, tag, in_stream_order(buffers), "migration", abort)
    for ticket in tickets:
        ticket.wait(mesh.timeout_s, abort, "moving stage state between devices")
    return sum(b.numel() * b.element_size() for _, buffers in receives for b in buffers.values())


def pace(nbytes: int, rate_bps: float | None) -> None:
    """Take as long as ``nbytes`` need on an emulated link of ``rate_bps`` (no link: return at once)."""
    if rate_bps:
        TokenBucket(rate_bps, burst_bytes=0).consume(nbytes)


def paced(arrays: dict[str, np.ndarray], rate_bps: float | None) -> dict[str, np.ndarray]:
    """``arrays``, once their bytes have taken their time on an emulated link of ``rate_bps`` (a worker's reply
    to the portal: its stage for the global copy or a heavy re-schedule)."""
    pace(sum(a.nbytes for a in arrays.values()), rate_bps)
    return arrays
