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
0.6-1.0 s where the lost stage's backup sat where its layers went.

**Both neighbours** (beyond the papers): a stage in the middle of the
pipeline is backed up on the stage before it as well as on the next, so
each device holds its neighbours' layers at the version it can be rolled
back to. A lightweight re-plan then moves cut points either way without
moving a byte: the lost stage's layers split between its two neighbours,
and any cut point between two survivors shifts within their stages. On
Asteroid's Env D (MobileNetV2, predicted on the presets), the cut points a
lightweight recovery chooses after losing device 1, 2 or 3 cost 0.11-0.38 s
of layer moves at 100 Mbps backed up one way (a confined run moved 6.4 MiB
at drops 2 and 3), and nothing backed up both ways. The price is one more
replica for each middle stage, sent while a sync-round computes
(:mod:`ecofl.pipeline.runtime.replica`).

**The busiest device spared** (beyond the papers): every replica a device
keeps is received and opened out of the CPU it computes with, while the round
computes; on the pipeline's busiest device that CPU is the round's. So a
stage with two neighbours is not backed up on the plan's busiest device
(:func:`busiest_device`), only on its other neighbour, and a neighbouring
stage of several devices backs up on another of them. On Eco-FL's confined
testbed (MobileNetV2, ``ecofl-3stage``) the busiest device (the TX2, stage 0,
busy 0.98 of the round) opened the middle stage's replica every round:
0.002-0.003 CPU-s of its 0.6 a round, half of what fault tolerance cost it
(``benchmarks/steady_runs.py``, the ``recv-from`` and ``replica-receiver``
jobs); with it spared, fault tolerance's cost per CPU-second of the TX2's
stage thread went from 1.4-1.9% to 0.6-0.7% (wall-clock, on a shared
2-core host, the two rules were within its noise). The price: layers a re-plan gives
the busiest device after a neighbour's loss travel to it. On Asteroid's
Env D (``benchmarks/adapt.py --emulate cgroup --parts asteroid``) the
lightweight plans after losing device 1 or 2 give the TX2 layers 9-12:
4.56 MiB travel and re-scheduling takes 0.47 s instead of 0.08-0.18 s.

A replicated (data-parallel) stage needs no backup: every device of it
holds the whole stage model, so a lost one is restored from a surviving
peer. This is FTPipeHD's chain replication (each worker to the next) laid
over Asteroid's stages. The portal also keeps a *global copy* of the whole
model every G sync-rounds (FTPipeHD's global replication), which restores a
device lost together with its backups, at the price of the rounds since
that copy.

A backup occupies the backup device's memory: :func:`backup_bytes` is what
the re-planner and the runtime's memory ledger add to the device's own
stage. Replicas travel while a sync-round computes, and the one kept stays
until the new one is complete, so a backup holds two of each during a round.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ecofl import names
from ecofl.devices import HomePool
from ecofl.pipeline.cost import device_passes_s
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile


#: Replicas of one stage a backup holds at most: the one kept, and the one arriving while a sync-round computes.
REPLICAS_HELD = 2
BACKUP_RULES = names.BACKUP_RULES


def backup_targets(plan: Plan, memory_bytes: Mapping[int, int] | None = None, spared: Collection[int] = (),
                   ) -> dict[int, tuple[int, ...]]:
    """``{device: its backup devices}`` for every single-device stage of a plan of two stages or more: one
    device of each neighbouring stage, the next stage's first (the first and the last stage have one neighbour).

    A neighbouring stage's backup device is its device with the largest
    memory budget (``memory_bytes``; ties and no budgets: the first one),
    leaving out the ``spared`` devices (:func:`busiest_device`) where the
    stage has others; a stage with two neighbours is not backed up on a
    spared device at all. A one-stage plan has no backups.
    """
    budgets, spared = dict(memory_bytes or {}), set(spared)
    targets = {}
    for s, stage in enumerate(plan.stages):
        if len(stage.devices) != 1:
            continue
        neighbours = [plan.stages[t].devices for t in (s + 1, s - 1) if 0 <= t < len(plan.stages)]
        chosen = [max([d for d in devices if d not in spared] or devices, key=lambda d: (budgets.get(d, 0), -d))
                  for devices in neighbours]
        kept = [d for d in chosen if d not in spared] or chosen[:1]
        if kept:
            targets[stage.devices[0]] = tuple(kept)
    return targets


def spared_devices(rule: str, plan: Plan, profile: ModelProfile | None, pool: HomePool) -> tuple[int, ...]:
    """The devices :func:`backup_targets` spares under ``rule`` (one of :data:`BACKUP_RULES`): the plan's busiest
    (where a profile tells it), or none."""
    if rule not in BACKUP_RULES:
        raise ValueError(f"backups must be one of {', '.join(BACKUP_RULES)}, got {rule!r}")
    return (busiest_device(plan, profile, pool),) if rule == "spare-busiest" and profile is not None else ()


def busiest_device(plan: Plan, profile: ModelProfile, pool: HomePool) -> int:
    """The device of ``plan`` with the most work a sync-round (:func:`ecofl.pipeline.cost.device_passes_s`): the
    one backups spare (:func:`backup_targets`)."""
    passes = device_passes_s(plan, profile, pool)
    return max(passes, key=passes.__getitem__)


def stage_state_bytes(profile: ModelProfile, layers: tuple[int, int]) -> int:
    """Bytes of a stage model's weights and optimizer state (what a replica or a migration carries)."""
    first, last = layers
    return int(profile.weight_bytes[first : last + 1].sum() + profile.optimizer_bytes[first : last + 1].sum())


def backup_bytes(plan: Plan, profile: ModelProfile, memory_bytes: Mapping[int, int] | None = None) -> dict[int, int]:
    """Bytes each backup device holds at most for the stages it backs up: the replica it keeps and the one
    arriving during a sync-round (:mod:`ecofl.pipeline.runtime.replica`); no device spared (what a backup may
    need wherever the runtime puts it)."""
    held: dict[int, int] = {}
    stage_of = {d: stage for stage in plan.stages for d in stage.devices}
    for source, targets in backup_targets(plan, memory_bytes).items():
        for target in targets:
            held[target] = held.get(target, 0) + REPLICAS_HELD * stage_state_bytes(profile, stage_of[source].layers)
    return held


def copy_bytes(plan: Plan, profile: ModelProfile, replicate_every: int, global_copy_every: int,
               memory_bytes: Mapping[int, int] | None = None, spared: Collection[int] = ()) -> dict[int, float]:
    """Bytes each device of ``plan`` seals or opens for fault tolerance in a sync-round, on average: every
    ``replicate_every`` sync-rounds (0: never) its stage's state once to each of its backups and the replicas
    it keeps for others; every ``global_copy_every`` (0: never), a stage's first device its stage's state to
    the portal (:mod:`ecofl.pipeline.runtime.copies`; backups as :func:`backup_targets` places them, sparing
    ``spared``). What the cost model charges each device's CPU for it (:func:`ecofl.pipeline.cost.simulate`'s
    ``background``)."""
    carried: dict[int, float] = {}
    stage_of = {d: stage for stage in plan.stages for d in stage.devices}
    if replicate_every:
        for source, targets in backup_targets(plan, memory_bytes, spared).items():
            state = stage_state_bytes(profile, stage_of[source].layers) / replicate_every
            for device in (source,) * len(targets) + tuple(targets):
                carried[device] = carried.get(device, 0.0) + state
    if global_copy_every:
        for stage in plan.stages:
            first = stage.devices[0]
            carried[first] = carried.get(first, 0.0) + stage_state_bytes(profile, stage.layers) / global_copy_every
    return carried


def restore_source(plan: Plan, device: int, lost: Collection[int], backups: Mapping[int, Sequence[int]],
                   ) -> int | None:
    """Where the stage model of lost ``device`` survives: a surviving stage peer, else its first live backup.

    None: only the portal's global copy has it (the device and its backups
    are all lost).
    """
    lost = set(lost)
    stage = next(st for st in plan.stages if device in st.devices)
    live = [d for d in stage.devices if d not in lost] or [d for d in backups.get(device, ()) if d not in lost]
    return live[0] if live else None
