"""The copies a home keeps to recover from: every single-device stage's backup on another device (Asteroid
§3.4, every ``replicate_every`` sync-rounds, sent while a sync-round computes: :mod:`.replica`) and the
portal's global copy of the whole model (FTPipeHD §III-F, every ``global_copy_every``)."""

from __future__ import annotations

import numpy as np

from ecofl.pipeline.replication import backup_targets
from ecofl.pipeline.runtime.control_messages import Collect, Replicate, StageWeights
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.layout import PipelineLayout


class Copies:
    """The backups and the global copy of one training call; the portal holds ``start`` as version 0."""

    def __init__(self, control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance, momentum: bool,
                 start: dict[str, np.ndarray]):
        self.control, self.layout, self.ft, self.momentum = control, layout, ft, momentum
        self.replica_version: int | None = None  # the version every backup holds (None: not yet in this plan)
        self._carried: int | None = None  # the sync-round that carries a replication now
        self.global_copy: tuple[int, dict[str, np.ndarray]] = (0, {k: np.asarray(v) for k, v in start.items()})

    def before_round(self, r: int) -> None:
        """Take the global copy where it is due before sync-round ``r``."""
        copy_every = self.ft.global_copy_every
        if copy_every and r % copy_every == 0 and self.global_copy[0] != r:
            self.global_copy = (r, self.collect())

    def replication(self, r: int) -> dict[int, Replicate]:
        """What each device sends and keeps while sync-round ``r`` computes, where a replication is due ({}: none):
        every single-device stage's state at ``r`` to its backup."""
        every = self.ft.replicate_every
        if not every or (self.replica_version is not None and r - self.replica_version < every):
            return {}
        layout = self.layout
        memory = {d: spec.memory_bytes for d, spec in enumerate(layout.pool.devices)}
        backups = backup_targets(layout.plan, memory)
        rank_of = {role.device: role.rank for role in layout.roles}
        stage_of = {d: stage for stage in layout.plan.stages for d in stage.devices}
        self._carried = r
        return {role.device: Replicate(r, rank_of[backups[role.device]] if role.device in backups else None,
                                       [(src, rank_of[src], *stage_of[src].layers)
                                        for src, dst in backups.items() if dst == role.device],
                                       layout.link_rate(role.device))
                for role in layout.roles}

    def round_completed(self, r: int) -> None:
        """Sync-round ``r`` is done: the replicas it carried are every backup's."""
        if self._carried == r:
            self.replica_version, self._carried = r, None

    def kept_versions(self, r: int) -> list[int]:
        """The committed versions besides ``r`` that the workers keep copies of during sync-round ``r``: the
        replicas' version (kept until the replicas of ``r`` are complete)."""
        return [] if self.replica_version is None or self.replica_version == r else [self.replica_version]

    def plan_changed(self) -> None:
        """A new plan has new backups: its first sync-round carries them."""
        self.replica_version, self._carried = None, None

    def collect(self) -> dict[str, np.ndarray]:
        """The whole model's state (weights and momentum) at the portal, each stage over its device's link."""
        for role in self.layout.roles:
            self.control.send(role.device, Collect(self.momentum, self.layout.link_rate(role.device)))
        state: dict[str, np.ndarray] = {}
        for _, arrays in self.control.gather_with_arrays(StageWeights).values():
            state.update({k: np.array(v) for k, v in arrays.items()})
        return state
