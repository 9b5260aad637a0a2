"""The copies a home keeps to recover from: every single-device stage's backups on its neighbours' devices
(Asteroid §3.4, every ``replicate_every`` sync-rounds: :mod:`.replica`) and the portal's global copy of the whole model
(FTPipeHD §III-F, every ``global_copy_every``: :mod:`.global_copy`), both sent while a sync-round computes."""

from __future__ import annotations

import numpy as np

from ecofl.devices import HomePool
from ecofl.pipeline.replication import backup_targets, spared_devices
from ecofl.pipeline.runtime.control_messages import GlobalCopy, Replicate
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.global_copy import CopyAssembly
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.stage_state import MOMENTUM


class Copies:
    """The backups and the global copy of one training call; the portal holds ``start`` as version 0."""

    def __init__(self, control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance, momentum: bool,
                 start: dict[str, np.ndarray]):
        self.control, self.layout, self.ft, self.momentum = control, layout, ft, momentum
        self.replica_version: int | None = None  # the version every backup holds (None: not yet in this plan)
        self._carried: int | None = None  # the sync-round that carries a replication now
        self.global_copy: tuple[int, dict[str, np.ndarray]] = (0, {k: np.asarray(v) for k, v in start.items()})
        self._incoming: CopyAssembly | None = None  # the global copy travelling in the sync-round under way

    def before_round(self, r: int) -> None:
        """Where the global copy is due at sync-round ``r``, its pieces are filed as the round's replies come
        (any other round's are dropped with it: an interrupted round's copy is not complete)."""
        copy_every = self.ft.global_copy_every
        due = bool(copy_every) and r % copy_every == 0 and self.global_copy[0] != r
        self._incoming = CopyAssembly(r, self._senders()) if due else None
        self.control.copy_pieces = self._incoming or CopyAssembly.refusing()

    def uploads(self, r: int) -> dict[int, GlobalCopy]:
        """Which devices send their stage for the global copy while sync-round ``r`` computes ({}: none due):
        the first device of every stage, at its link rate to the portal."""
        if self._incoming is None or self._incoming.version != r:
            return {}
        return {device: GlobalCopy(self.layout.link_rate(device)) for device in self._incoming.expected}

    def _senders(self) -> dict[int, list[str]]:
        """The first device of every stage, and the keys of its stage's state (with momentum buffers)."""
        layout = self.layout
        senders = {}
        for role in layout.roles:
            if role.rank == role.replicas[0]:
                keys = layout.stage_keys[role.stage]
                momentum = [MOMENTUM + k for k in keys if k in layout.parameter_keys] if self.momentum else []
                senders[role.device] = keys + momentum
        return senders

    def replication(self, r: int, pool: HomePool) -> dict[int, Replicate]:
        """What each device sends and keeps while sync-round ``r`` computes, where a replication is due ({}: none):
        every single-device stage's state at ``r`` to its backups (as the fault tolerance's ``backups`` rule places
        them on ``pool``, the devices at the speeds known now: :func:`ecofl.pipeline.replication.spared_devices`)."""
        every = self.ft.replicate_every
        if not every or (self.replica_version is not None and r - self.replica_version < every):
            return {}
        layout = self.layout
        memory = {d: spec.memory_bytes for d, spec in enumerate(layout.pool.devices)}
        spared = spared_devices(self.ft.backups, layout.plan, layout.profile, pool)
        backups = backup_targets(layout.plan, memory, spared)
        rank_of = {role.device: role.rank for role in layout.roles}
        stage_of = {d: stage for stage in layout.plan.stages for d in stage.devices}
        self._carried = r
        return {role.device: Replicate(r, [rank_of[b] for b in backups.get(role.device, ())],
                                       [(src, rank_of[src], *stage_of[src].layers)
                                        for src, targets in backups.items() if role.device in targets],
                                       layout.link_rate(role.device))
                for role in layout.roles}

    def round_completed(self, r: int) -> None:
        """Sync-round ``r`` is done: the replicas it carried are every backup's, its global copy the portal's."""
        if self._carried == r:
            self.replica_version, self._carried = r, None
        if self._incoming is not None and self._incoming.version == r:
            self.global_copy = (r, self._incoming.result())
            self._incoming, self.control.copy_pieces = None, CopyAssembly.refusing()

    def kept_versions(self, r: int) -> list[int]:
        """The committed versions besides ``r`` that the workers keep copies of during sync-round ``r``: the
        replicas' version (kept until the replicas of ``r`` are complete)."""
        return [] if self.replica_version is None or self.replica_version == r else [self.replica_version]

    def plan_changed(self) -> None:
        """A new plan has new backups: its first sync-round carries them (and the global copy, if due)."""
        self.replica_version, self._carried = None, None
        self._incoming, self.control.copy_pieces = None, CopyAssembly.refusing()
