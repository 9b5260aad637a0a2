"""What a worker's copies do while its sync-round computes: its replicas (:mod:`.replica`) and its stage for the
portal's global copy (:mod:`.global_copy`), started with the round and finished (or stopped) with it."""

from __future__ import annotations

from collections.abc import Callable

from ecofl.net.links import AbortCheck
from ecofl.net.mesh import EpochMesh
from ecofl.net.pacing import TokenBucket
from ecofl.pipeline.runtime.control_messages import CopyPiece, TrainPass
from ecofl.pipeline.runtime.global_copy import Arrays, CopyUpload
from ecofl.pipeline.runtime.replica import ReplicaExchange
from ecofl.pipeline.runtime.stage_state import StageState, as_arrays
from ecofl.pipeline.runtime.traps import Traps


class RoundCopies:
    """The replicas and the global copy that ``request`` asks of a worker holding ``state`` of ``stage_layers``:
    sent on ``mesh`` (replicas, paced by ``links`` where the stage's own tensors are) and by ``reply`` (the
    global copy's pieces); each phase point is reached on ``traps`` once its copy is on its way."""

    def __init__(self, request: TrainPass, state: StageState, stage_layers: range, with_momentum: bool,
                 mesh: EpochMesh, links: dict[int, TokenBucket], reply: Callable[[CopyPiece, Arrays], None],
                 traps: Traps):
        self.replicas: ReplicaExchange | None = None
        self.upload: CopyUpload | None = None
        if (replicate := request.replicate) is not None:
            version = replicate.version
            mine = state.layers_state(stage_layers, version) if replicate.to else None
            sends = [(rank, mine) for rank in replicate.to]
            receives = [(rank, state.empty_like_layers(range(first, last + 1), with_momentum))
                        for _source, rank, first, last in replicate.sources]
            buckets = {rank: links.get(rank) or (TokenBucket(replicate.link_bps) if replicate.link_bps else None)
                       for rank, _ in sends}
            self.replicas = ReplicaExchange(mesh, sends, receives, buckets,
                                            lambda buffers: state.hold(version, buffers))  # a complete replica
            traps.reached("replicate")
        if request.global_copy is not None:
            self.upload = CopyUpload(reply, request.version,
                                     as_arrays(state.layers_state(stage_layers, request.version)),
                                     request.global_copy.link_bps)
            traps.reached("global-copy")

    @property
    def travelling(self) -> list[ReplicaExchange | CopyUpload]:
        return [copies for copies in (self.replicas, self.upload) if copies is not None]

    @property
    def received_bytes(self) -> int:
        """The bytes of the replicas kept here (the executor reserves room for them)."""
        return self.replicas.received_bytes if self.replicas is not None else 0

    @property
    def replica_after_s(self) -> float | None:
        """When the replicas kept here were complete, from the round's start (None: none kept here)."""
        return self.replicas.complete_after_s if self.replicas is not None and self.replicas.receives else None

    @property
    def global_copy_after_s(self) -> float | None:
        """When my stage's global copy was sent, from the round's start (None: none asked)."""
        return self.upload.sent_after_s if self.upload is not None else None

    def ended_cpu_s(self) -> dict[str, float]:
        """The CPU seconds of the threads that have ended, by job (:meth:`.ThreadClock.by_job`'s ``finished``)."""
        return {job: seconds for copies in self.travelling for job, seconds in copies.ended_cpu_s().items()}

    def finish(self, abort: AbortCheck) -> None:
        """Wait until every copy has travelled; re-raise what went wrong."""
        for copies in self.travelling:
            copies.finish(abort)

    def stop(self) -> None:
        """Stop every copy (an interrupted round): a replica not complete is not kept, nor a global copy."""
        for copies in self.travelling:
            copies.stop()
