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

import statistics

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
    return _slowest_mapping_s(plan, profile, pool, before, unmeasured=None)


def estimated_first_round_extra_s(plan: Plan, profile: ModelProfile, pool: HomePool, before: Plan | None) -> float:
    """:func:`first_round_extra_s` with a device that has no measurement taken at the mean of the pool's devices
    that have one (a re-plan must not see an unmeasured device as free to map); 0 where none has."""
    measured = [spec.first_touch_s_per_byte for spec in pool.devices if spec.first_touch_s_per_byte is not None]
    if not measured:
        return 0.0
    return _slowest_mapping_s(plan, profile, pool, before, unmeasured=statistics.fmean(measured))


def _slowest_mapping_s(plan: Plan, profile: ModelProfile, pool: HomePool, before: Plan | None,
                       unmeasured: float | None) -> float | None:
    """The longest a device of ``plan`` maps memory beyond what it held under ``before``, an unmeasured device
    at ``unmeasured`` seconds per byte (None: the answer is None)."""
    held = mapped_bytes(before, profile) if before is not None else {}
    slowest = 0.0
    for device, size in mapped_bytes(plan, profile).items():
        s_per_byte = pool.devices[device].first_touch_s_per_byte
        s_per_byte = unmeasured if s_per_byte is None else s_per_byte
        if s_per_byte is None:
            return None
        slowest = max(slowest, max(0, size - held.get(device, 0)) * s_per_byte)
    return slowest


def switching_s(plan: Plan, before: Plan, holders: Holders, profile: ModelProfile, pool: HomePool) -> float:
    """What moving from ``before`` to ``plan`` costs beyond ``plan``'s own sync-rounds: its layer moves from
    ``holders`` over the links (:func:`ecofl.pipeline.migration.migration_s`) and the memory its devices map
    for the first time in its first round (:func:`estimated_first_round_extra_s`)."""
    return migration_s(plan, holders, profile, pool) + estimated_first_round_extra_s(plan, profile, pool, before)
