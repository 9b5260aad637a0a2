"""The memory model of a training plan: each device's peak bytes by Asteroid eq. 3.

Mem_p(beta) = MOD + OPT + K_p x ACT_p(beta) (Asteroid §3.2, eq. 3), with
MOD = weights + accumulated gradients (2 x weight bytes, as Asteroid counts
them), OPT = optimizer state, ACT_p(beta) = stashed bytes per sample of the
stage's layers x beta (the device's share of a micro-batch), and K_p the most
forward tasks resident at once under the schedule: min(K_0..K_p, M) for
1F1B-Sync, M for GPipe, min(S - p, M) for asynchronous 1F1B, which also keeps
weight versions (FTPipeHD §III-C). It is an accounting of what the runtime
keeps, not a measurement: the runtime reports its workers' real peak RSS
beside it. A stream (inference) plan's memory is
:mod:`ecofl.pipeline.stream`'s.
"""

from __future__ import annotations

from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan, require_training
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.schedule import ActionKind, Schedule


def stage_memory_bytes(profile: ModelProfile, layers: tuple[int, int], samples: int, resident: int) -> int:
    """Asteroid eq. 3 for one device: 2 x weights + optimizer state + resident x stash x samples."""
    first, last = layers
    span = slice(first, last + 1)
    model = 2 * int(profile.weight_bytes[span].sum())
    optimizer = int(profile.optimizer_bytes[span].sum())
    activations = int(profile.stash_bytes[span].sum()) * samples
    return model + optimizer + resident * activations


def resident_forwards(plan: Plan, stage: int) -> int:
    """Forward tasks a stage holds at most: min(K_0..K_s, M) under 1F1B-Sync, M under GPipe, min(S - s, M)
    under asynchronous 1F1B."""
    require_training(plan)
    return mode_of(plan).resident_forwards(plan, stage)


def memory_per_stage(plan: Plan, profile: ModelProfile) -> list[int]:
    """Peak bytes of each stage's most loaded device (Asteroid eq. 3), without simulating."""
    return [
        stage_memory_bytes(profile, stage.layers, max(stage.shares), resident_forwards(plan, s))
        + weight_versions_bytes(plan, profile, s)
        for s, stage in enumerate(plan.stages)
    ]


def weight_versions_bytes(plan: Plan, profile: ModelProfile, stage: int) -> int:
    """Asynchronous 1F1B's extra weights on a stage: its S - s in-flight versions (weight stashing) and its
    last S - s versions (FTPipeHD's aggregation averages them); 0 for the synchronous schedules."""
    first, last = plan.stages[stage].layers
    window = mode_of(plan).version_window(len(plan.stages), stage)  # stashed, and again the recent to average
    return 2 * window * int(profile.weight_bytes[first : last + 1].sum())


def peak_memory(plan: Plan, profile: ModelProfile, schedule: Schedule) -> tuple[list[int], dict[int, int]]:
    """Asteroid eq. 3 per device with the most forward tasks the schedule keeps resident (plus asynchronous
    1F1B's weight versions, :func:`weight_versions_bytes`)."""
    stage_peak, device_peak = [], {}
    for s, (stage, actions) in enumerate(zip(plan.stages, schedule)):
        resident = most = 0
        for action in actions:
            resident += 1 if action.kind == ActionKind.FORWARD else -1
            most = max(most, resident)
        for device, share in zip(stage.devices, stage.shares):
            device_peak[device] = (stage_memory_bytes(profile, stage.layers, share, most)
                                   + weight_versions_bytes(plan, profile, s))
        stage_peak.append(max(device_peak[d] for d in stage.devices))
    return stage_peak, device_peak
