"""The copies a home keeps to recover from: every single-device stage's backup on another device (Asteroid
§3.4, every ``replicate_every`` sync-rounds) and the portal's global copy of the whole model (FTPipeHD §III-F,
every ``global_copy_every``)."""

from __future__ import annotations

import numpy as np

from ecofl.pipeline.replication import backup_targets
from ecofl.pipeline.runtime.control_messages import Collect, Replicate, Replicated, StageWeights
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.layout import PipelineLayout


class Copies:
    """The backups and the global copy of one training call; the portal holds ``start`` as version 0."""

    def __init__(self, control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance, momentum: bool,
                 start: dict[str, np.ndarray]):
        self.control, self.layout, self.ft, self.momentum = control, layout, ft, momentum
        self.replica_version: int | None = None  # the version every backup holds (None: replicate before a round)
        self.global_copy: tuple[int, dict[str, np.ndarray]] = (0, {k: np.asarray(v) for k, v in start.items()})

    def before_round(self, r: int) -> None:
        """Replicate and take the global copy where they are due before sync-round ``r``."""
        every = self.ft.replicate_every
        if every and (self.replica_version is None or r - self.replica_version >= every):
            self.replicate(r)
        copy_every = self.ft.global_copy_every
        if copy_every and r % copy_every == 0 and self.global_copy[0] != r:
            self.global_copy = (r, self.collect())

    def kept_versions(self, r: int) -> list[int]:
        """The committed versions besides ``r`` that the workers keep copies of during sync-round ``r``."""
        return [] if self.replica_version is None or self.replica_version == r else [self.replica_version]

    def plan_changed(self) -> None:
        """A new plan has new backups: they are filled before the next sync-round."""
        self.replica_version = None

    def replicate(self, version: int) -> None:
        """Every single-device stage sends its state at ``version`` to its backup."""
        layout = self.layout
        memory = {d: spec.memory_bytes for d, spec in enumerate(layout.pool.devices)}
        backups = backup_targets(layout.plan, memory)
        rank_of = {role.device: role.rank for role in layout.roles}
        stage_of = {d: stage for stage in layout.plan.stages for d in stage.devices}
        for role in layout.roles:
            sources = [(src, rank_of[src], *stage_of[src].layers) for src, dst in backups.items() if dst == role.device]
            to = rank_of[backups[role.device]] if role.device in backups else None
            self.control.send(role.device, Replicate(version, to, sources, layout.link_rate(role.device)))
        self.control.gather(Replicated)
        self.replica_version = version

    def collect(self) -> dict[str, np.ndarray]:
        """The whole model's state (weights and momentum) at the portal."""
        for role in self.layout.roles:
            self.control.send(role.device, Collect(self.momentum))
        state: dict[str, np.ndarray] = {}
        for _, arrays in self.control.gather_with_arrays(StageWeights).values():
            state.update({k: np.array(v) for k, v in arrays.items()})
        return state
