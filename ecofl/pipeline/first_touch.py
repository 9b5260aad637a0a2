"""The first sync-round of a new stage: the memory a device's process maps for the first time.

A worker keeps the memory its stage freed (:mod:`ecofl.allocator`), so a
stage maps its gradients, optimizer state and held activations once: in its
first sync-round. A re-plan that hands a device a stage holding more than
its last one (more layers, bigger micro-batches) makes its first round
longer by the difference, mapped page by page out of the device's own CPU
(docs/pipeline.md, "A new stage's first round"). Sizes are Asteroid eq. 3's
(:func:`~ecofl.pipeline.memory_model.stage_memory_bytes`) without the
weights, which every worker holds from its start; each device's seconds per
byte are measured in its calibration (:mod:`ecofl.pipeline.runtime.calibration`) and carried in the
pool (``DeviceSpec.first_touch_s_per_byte``). A re-plan (a recovery, a re-tune)
weighs this with its layer moves (:func:`switching_s`).
"""

from __future__ import annotations

from ecofl.devices import HomePool
from ecofl.pipeline.memory_model import resident_forwards, stage_memory_bytes
from ecofl.pipeline.migration import Holders, migration_s
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile


def mapped_bytes(plan: Plan, profile: ModelProfile) -> dict[int, int]:
    """Each device's memory under ``plan`` beyond the weights: gradients, optimizer state, held activations."""
    mapped = {}
    for s, stage in enumerate(plan.stages):
        first, last = stage.layers
        weights = int(profile.weight_bytes[first : last + 1].sum())
        for device, share in zip(stage.devices, stage.shares):
            mapped[device] = stage_memory_bytes(profile, stage.layers, share, resident_forwards(plan, s)) - weights
    return mapped


def first_round_extra_s(plan: Plan, profile: ModelProfile, pool: HomePool, before: Plan | None = None
                        ) -> float | None:
    """How much longer ``plan``'s first sync-round takes than its later ones, for devices that ran ``before``
    (None: nothing yet, a run's first round): the slowest device's new bytes at its ``first_touch_s_per_byte``.
    The slowest, not the sum: the stages map their memory in their first forwards, while the pipeline fills,
    and the round waits for the one that maps longest. None where a device of ``plan`` has no measurement."""
    mapping = mapping_s(plan, profile, pool, before)
    return None if None in mapping.values() else max(mapping.values(), default=0.0)


def mapping_s(plan: Plan, profile: ModelProfile, pool: HomePool, before: Plan | None) -> dict[int, float | None]:
    """Each device's seconds mapping its memory under ``plan`` beyond what it held under ``before`` (None: its
    seconds per byte are not measured)."""
    held = mapped_bytes(before, profile) if before is not None else {}
    seconds: dict[int, float | None] = {}
    for device, size in mapped_bytes(plan, profile).items():
        s_per_byte = pool.devices[device].first_touch_s_per_byte
        seconds[device] = None if s_per_byte is None else max(0, size - held.get(device, 0)) * s_per_byte
    return seconds


def switching_s(plan: Plan, before: Plan, holders: Holders, profile: ModelProfile, pool: HomePool) -> float:
    """What moving from ``before`` to ``plan`` costs beyond ``plan``'s own sync-rounds: its layer moves from
    ``holders`` over the links (:func:`ecofl.pipeline.migration.migration_s`) and the memory its devices map
    for the first time in its first round (the devices whose seconds per byte are measured)."""
    mapping = [s for s in mapping_s(plan, profile, pool, before).values() if s is not None]
    return migration_s(plan, holders, profile, pool) + max(mapping, default=0.0)
