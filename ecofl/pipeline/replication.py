"""Who keeps a copy of whose weights, as plain data (Asteroid §3.4, FTPipeHD §III-E).

**Topology-driven replication** (Asteroid §3.4, Fig. 9): the device of a
single-device stage backs its stage model (weights and optimizer state) up
to a *backup device* in the next stage. Asteroid backs the last stage up to
the first; here it goes to the stage before it, where a lightweight re-plan
(:func:`ecofl.pipeline.replan.lightweight_replan`: the stages keep their
order, a lost stage's layers go to its neighbours) puts its layers when its
device is lost. Backed up to the first stage, they had to travel there from
the first stage's device: on Eco-FL's confined testbed (MobileNetV2,
``ecofl-3stage``, ``--inject kill:2@4``) a kill of the last device moved
16 MB and training resumed 3.3 s after it, against nothing moved and
0.6-1.0 s where the lost stage's backup sat where its layers went. A
replicated (data-parallel) stage needs no backup: every device of it holds
the whole stage model, so a lost one is restored from a surviving peer. This
is FTPipeHD's chain replication (each worker to the next) laid over
Asteroid's stages. The portal also keeps a *global copy* of the whole model
every G sync-rounds (FTPipeHD's global replication), which restores a device
lost together with its backup, at the price of the rounds since that copy.

A backup occupies the backup device's memory: :func:`backup_bytes` is what
the re-planner and the runtime's memory ledger add to the device's own
stage. Replicas travel while a sync-round computes, and the one kept stays
until the new one is complete, so a backup holds two of each during a round.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile


#: Replicas of one stage a backup holds at most: the one kept, and the one arriving while a sync-round computes.
REPLICAS_HELD = 2


def backup_targets(plan: Plan, memory_bytes: Mapping[int, int] | None = None) -> dict[int, int]:
    """``{device: backup device}`` for every single-device stage of a plan of two stages or more.

    The backup device is the next stage's device with the largest memory
    budget (``memory_bytes``; ties and no budgets: the first one); the last
    stage's is the stage's before it (the first, in a two-stage plan). A
    one-stage plan has no backups.
    """
    if len(plan.stages) < 2:
        return {}
    budgets = dict(memory_bytes or {})
    targets = {}
    for s, stage in enumerate(plan.stages):
        if len(stage.devices) != 1:
            continue
        neighbour = plan.stages[s + 1 if s + 1 < len(plan.stages) else s - 1].devices
        targets[stage.devices[0]] = max(neighbour, key=lambda d: (budgets.get(d, 0), -d))
    return targets


def stage_state_bytes(profile: ModelProfile, layers: tuple[int, int]) -> int:
    """Bytes of a stage model's weights and optimizer state (what a replica or a migration carries)."""
    first, last = layers
    return int(profile.weight_bytes[first : last + 1].sum() + profile.optimizer_bytes[first : last + 1].sum())


def backup_bytes(plan: Plan, profile: ModelProfile, memory_bytes: Mapping[int, int] | None = None) -> dict[int, int]:
    """Bytes each backup device holds at most for the stages it backs up: the replica it keeps and the one
    arriving during a sync-round (:mod:`ecofl.pipeline.runtime.replica`)."""
    held: dict[int, int] = {}
    stage_of = {d: stage for stage in plan.stages for d in stage.devices}
    for source, target in backup_targets(plan, memory_bytes).items():
        held[target] = held.get(target, 0) + REPLICAS_HELD * stage_state_bytes(profile, stage_of[source].layers)
    return held


def restore_source(plan: Plan, device: int, lost: Collection[int], backups: Mapping[int, int]) -> int | None:
    """Where the stage model of lost ``device`` survives: a surviving stage peer, else its live backup.

    None: only the portal's global copy has it (the device and its backup are
    both lost).
    """
    lost = set(lost)
    stage = next(st for st in plan.stages if device in st.devices)
    peers = [d for d in stage.devices if d not in lost]
    if peers:
        return peers[0]
    backup = backups.get(device)
    return backup if backup is not None and backup not in lost else None
