"""The host CPU a byte of fault tolerance's copies costs: what the cost model charges for each byte a device
seals or opens for its replicas and its part of the global copy.

The charge was the host's time per byte of activations (``byte_overhead_s``,
:mod:`.host_overhead`): 3.0 ns on this project's 2-core host, which matched
the cost fault tolerance measured while a replica's byte was copied twice
and slowed the stages beside it. Opened in place (:mod:`.byte_stream`), a
replica's byte costs about a third of that, and a prediction that kept the
old charge said +9.0% where +3.7% was measured (docs/pipeline.md, "A replica
opened where it stays"). So the copies' own path is measured, once per host
and cached beside the profiles: a state laid out as a committed copy is,
sent over one sealed TCP link on loopback in this process in the background
pieces of a link, and opened in place at the other end, as a replica
travels; every thread's CPU time over twice its bytes (each byte is sealed
at one end and opened at the other). It is measured twice: paced at the
testbeds' 100 Mbps, as an emulated device's links are, and not paced, as
at host speed. A paced piece costs its ends a wake-up out of the pause
before it besides its bytes, so the two differ (``benchmarks/copy_path.py``
measures the same path beside the old ones, by thread).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
from pathlib import Path

import torch

from ecofl.devices import host_cores
from ecofl.net.links import POLL_S, REPLICA_TAG, AbortCheck, PeerLink, Ticket, never_aborted
from ecofl.net.pacing import TokenBucket
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.profile import DEFAULT_CACHE_DIR
from ecofl.pipeline.runtime.byte_stream import (PIECE_S, in_stream_order, opened_in_place, receive_stream,
                                                send_stream, stream_buffers)
from ecofl.pipeline.runtime.replica import STOP_CHECK_S
from ecofl.pipeline.runtime.thread_cpu import ThreadClock

LINK_BPS = 100e6 / 8  # the confined testbeds' links
MEASURED_BYTES = 8 << 20
RECORD_VERSION = 2  # 1: over a socket pair, paced only, in 50 ms pieces


class LinkedPair:
    """Rank 0's and rank 1's ends of one sealed link in this process, with the mesh methods a byte stream uses
    (:class:`ecofl.net.mesh.EpochMesh`'s ``send``, ``recv``, ``receive_into``, ``forget``; a context manager)."""

    def __init__(self) -> None:
        # a TCP connection on loopback, as between a home's devices; both ends in this process, no home to join
        with socket.create_server(("127.0.0.1", 0)) as server:
            a = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            a.connect(server.getsockname())
            b, _ = server.accept()
        for end in (a, b):
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        there, back = os.urandom(32), os.urandom(32)
        self.links = {1: PeerLink(SealedSocket(a, there, back), 1), 0: PeerLink(SealedSocket(b, back, there), 0)}
        self.timeout_s = 60.0

    def send(self, dst: int, tensor: torch.Tensor, tag: int, bucket: TokenBucket | None = None,
             background: bool = False) -> Ticket:
        return self.links[dst].post(tensor, tag, bucket, background)

    def recv(self, src: int, tag: int, timeout_s: float | None = None, abort: AbortCheck = never_aborted,
             poll_s: float = POLL_S) -> torch.Tensor:
        return self.links[src].take(tag, timeout_s or self.timeout_s, abort, poll_s)

    def receive_into(self, src: int, tag: int, buffers: list[torch.Tensor]) -> bool:
        return self.links[src].receive_into(tag, buffers)

    def forget(self, src: int, tag: int, buffer: torch.Tensor) -> None:
        self.links[src].forget(tag, buffer)

    def __enter__(self) -> "LinkedPair":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for link in self.links.values():
            link.close()


def send_replica(pair: LinkedPair, sent: dict[str, torch.Tensor], received: dict[str, torch.Tensor],
                 rate_bps: float | None, in_place: bool = True, poll_s: float = POLL_S,
                 piece_s: float = PIECE_S) -> None:
    """``sent`` from rank 0 into ``received`` at rank 1, as a replica travels (paced at ``rate_bps`` in pieces
    of ``piece_s``; opened in place where ``in_place`` and the buffers allow it); returns once every piece was
    sent and received."""
    bucket = TokenBucket(rate_bps) if rate_bps else None
    with opened_in_place(pair, [(0, in_stream_order(received))] if in_place else [], REPLICA_TAG):
        tickets = send_stream(pair, 1, in_stream_order(sent), REPLICA_TAG, bucket, background=True, piece_s=piece_s)
        receive_stream(pair, 0, REPLICA_TAG, in_stream_order(received), "replica", poll_s=poll_s)
    for ticket in tickets:
        ticket.wait(pair.timeout_s)


def measure_copy_byte_s(paced: bool, nbytes: int = MEASURED_BYTES, repeats: int = 3) -> float:
    """Host CPU seconds a byte of a replica costs one end (module docstring), its link ``paced`` at
    :data:`LINK_BPS` or not: the median of ``repeats`` transfers after a first one not counted, on one torch
    thread as a worker runs (more would spin beside the transfer and be counted)."""
    generator = torch.Generator().manual_seed(0)
    state = {key: torch.randn(nbytes // 8, generator=generator) for key in ("weight", "momentum/weight")}
    per_byte = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with LinkedPair() as pair:
            for _ in range(repeats + 1):
                sent, received = stream_buffers(state), stream_buffers(state)
                for key, value in state.items():
                    sent[key].copy_(value)
                clock = ThreadClock()
                send_replica(pair, sent, received, LINK_BPS if paced else None, poll_s=STOP_CHECK_S)
                per_byte.append(clock.process_s() / (2 * nbytes))
                if not all(torch.equal(received[key], value) for key, value in state.items()):
                    raise RuntimeError("a measured replica arrived different from what was sent")
    finally:
        torch.set_num_threads(threads)
    return statistics.median(per_byte[1:])


def record_path(cache_dir: str | None = None) -> Path:
    """Where this host's measurement is cached (per record version, torch version and cores)."""
    path = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE_DIR
    return path / f"copy-cost-v{RECORD_VERSION}-torch{torch.__version__}-{host_cores()}cores.json"


def host_copy_byte_s(paced: bool, cache_dir: str | None = None) -> float:
    """Host CPU seconds a byte of fault tolerance's copies costs one end on this host, its links ``paced`` (as
    an emulated device's are) or not (at host speed): both measured once, then read from their cache."""
    path = record_path(cache_dir)
    if not path.exists():
        record = {"paced_byte_s": measure_copy_byte_s(paced=True), "unpaced_byte_s": measure_copy_byte_s(paced=False),
                  "bytes": MEASURED_BYTES, "paced_link_bps": LINK_BPS, "piece_s": PIECE_S, "cores": host_cores()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1))
    return float(json.loads(path.read_text())["paced_byte_s" if paced else "unpaced_byte_s"])
