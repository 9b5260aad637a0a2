"""Prefix sums over layers from which the planners read any stage's cost in O(1), per objective.

A stage covering layers ``i .. j-1`` (half-open, ``0 <= i < j <= L``) costs

- compute: ``compute[j] - compute[i]`` host seconds of one micro-batch,
  divided by the device's speed (:mod:`ecofl.devices`);
- memory, for ``K`` resident tasks of ``share`` samples on one device:
  ``static[j] - static[i] + K * share * resident_span[i, j] + share * transient_span[i, j]``;
- a cut before layer ``j`` sends ``cut_bytes[j]`` per sample.

Two objectives fill them differently:

- ``"training"`` (1F1B-Sync): forward + backward time; memory is Asteroid
  eq. 3 exactly as :func:`ecofl.pipeline.memory_model.stage_memory_bytes` counts it
  (static = MOD + OPT = 2 x weights, parameters + accumulated gradients, plus
  optimizer state; a resident forward task keeps the stage's stashed bytes;
  no transient); a cut carries the activation of layer j-1 forward plus the
  gradient of layer j's input backward (the ``(a_s + b_s)`` of Eco-FL eq. 1).
- ``"inference"`` (a forward-only stream, PipeEdge §III-B): forward time only;
  memory as :func:`ecofl.pipeline.stream.stream_stage_memory_bytes` counts it
  (static = the weights, no gradients, no optimizer state; a resident
  micro-batch holds the stage's input and output, ``x_i + x_j`` bytes per
  sample; the forward running holds one layer's working set, the largest
  stash + output of the stage's layers); a cut carries the activation only
  (PipeEdge's P_j). The portal's transfers are pipeline resources too: it
  sends ``input_bytes`` per sample to stage 0 and receives ``output_bytes``
  per sample (the predictions) from the last stage, unless that stage is the
  portal itself (:func:`ecofl.pipeline.planners.chain.portal_seconds`).

Matrices ``[L+1, L+1]`` indexed ``[i, j]`` hold every stage at once so the
dynamic programmes run as numpy array operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ecofl.errors import UserError
from ecofl.pipeline.plan import STREAM_IN_FLIGHT, ScheduleKind
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.schedule import target_in_flight

OBJECTIVES: tuple[str, ...] = ("training", "inference")


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))


def span(prefix: np.ndarray) -> np.ndarray:
    """``[i, j] -> prefix[j] - prefix[i]`` for all i, j (only i < j is meaningful)."""
    return prefix[None, :] - prefix[:, None]


@dataclass(frozen=True)
class StageTables:
    """Per-layer prefix sums of one model at one micro-batch size, for one objective."""

    micro_batch: int
    compute: np.ndarray  # [L+1] host seconds of a micro-batch: forward + backward (training) or forward
    static: np.ndarray  # [L+1] bytes: 2 x weights + optimizer state (training) or weights (inference)
    weights: np.ndarray  # [L+1] bytes all-reduced by a data-parallel stage (Asteroid eq. 5)
    cut_bytes: np.ndarray  # [L+1] bytes per sample crossing a cut before layer j (0 at j = 0, L)
    resident_span: np.ndarray  # [L+1, L+1] bytes per sample one resident task of layers i..j-1 holds
    transient_span: np.ndarray  # [L+1, L+1] bytes per sample of the running forward, beside the resident tasks
    objective: str = "training"
    input_bytes: float = 0.0  # inference: per sample from the portal to stage 0 (training: not in eq. 1)
    output_bytes: float = 0.0  # inference: per sample from the last stage back to the portal

    @property
    def num_layers(self) -> int:
        return len(self.compute) - 1

    @property
    def schedule(self) -> ScheduleKind:
        """The plan schedule this objective runs: 1F1B-Sync or a forward-only stream."""
        return ScheduleKind.STREAM if self.objective == "inference" else ScheduleKind.ONE_F_ONE_B

    def in_flight_target(self, num_stages: int, stage: int) -> int:
        """Tasks stage ``stage`` of ``num_stages`` should hold: P_s = 2(S-s)-1 (training), 3 (inference)."""
        return STREAM_IN_FLIGHT if self.objective == "inference" else target_in_flight(num_stages, stage)

    @property
    def static_span(self) -> np.ndarray:
        return span(self.static)

    @property
    def compute_span(self) -> np.ndarray:
        return span(self.compute)

    def memory_span(self, tasks: int, share: int) -> np.ndarray:
        """``[i, j]`` bytes of layers i..j-1 holding ``tasks`` resident tasks of ``share`` samples."""
        return self.static_span + tasks * share * self.resident_span + share * self.transient_span

    def stage_memory(self, first: int, end: int, tasks: int, share: int) -> float:
        """Bytes of layers first..end-1 holding ``tasks`` resident tasks of ``share`` samples."""
        static = self.static[end] - self.static[first]
        return static + tasks * share * self.resident_span[first, end] + share * self.transient_span[first, end]

    def valid(self) -> np.ndarray:
        """``[i, j]`` True where ``i < j``: a non-empty stage."""
        n = self.num_layers + 1
        return np.triu(np.ones((n, n), dtype=bool), k=1)


def check_objective(objective: str) -> str:
    """``objective`` if it is one; else a UserError naming the objectives."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; valid: {', '.join(OBJECTIVES)}")
    return objective


def static_bytes(profile: ModelProfile) -> np.ndarray:
    """Per-layer MOD + OPT of Asteroid eq. 3 (as the cost model counts them)."""
    return 2 * np.asarray(profile.weight_bytes, dtype=float) + np.asarray(profile.optimizer_bytes, dtype=float)


def cut_bytes(profile: ModelProfile) -> np.ndarray:
    """Bytes per sample crossing a cut before layer j, for j = 0..L (none at the ends)."""
    cuts = np.zeros(profile.num_layers + 1)
    cuts[1:-1] = np.asarray(profile.activation_bytes[:-1], dtype=float) + np.asarray(
        profile.gradient_bytes[1:], dtype=float
    )
    return cuts


def boundary_bytes(profile: ModelProfile) -> np.ndarray:
    """``[j]`` bytes per sample entering layer j, j = 0..L (the model's input at 0, its output at L)."""
    return np.concatenate(([float(profile.input_bytes)], np.asarray(profile.activation_bytes, dtype=float)))


def range_max(values: np.ndarray) -> np.ndarray:
    """``[i, j]``: the largest of ``values[i:j]`` (0 where j <= i)."""
    n = len(values)
    out = np.zeros((n + 1, n + 1))
    for i in range(n):
        out[i, i + 1 :] = np.maximum.accumulate(values[i:])
    return out


def stage_tables(profile: ModelProfile, micro_batch: int, objective: str = "training") -> StageTables:
    """The prefix sums of ``profile`` with micro-batches of ``micro_batch`` samples, for ``objective``."""
    check_objective(objective)
    forward, backward = profile.layer_times(micro_batch)
    weights = _prefix(profile.weight_bytes)
    if objective == "training":
        size = profile.num_layers + 1
        return StageTables(
            micro_batch=micro_batch,
            compute=_prefix(forward + backward),
            static=_prefix(static_bytes(profile)),
            weights=weights,
            cut_bytes=cut_bytes(profile),
            resident_span=span(_prefix(profile.stash_bytes)),
            transient_span=np.zeros((size, size)),
            objective=objective,
        )
    boundary = boundary_bytes(profile)
    cuts = boundary.copy()
    cuts[[0, -1]] = 0.0
    working = np.asarray(profile.stash_bytes, dtype=float) + np.asarray(profile.activation_bytes, dtype=float)
    return StageTables(
        micro_batch=micro_batch,
        compute=_prefix(forward),
        static=weights,
        weights=weights,
        cut_bytes=cuts,
        resident_span=boundary[:, None] + boundary[None, :],
        transient_span=range_max(working),
        objective=objective,
        input_bytes=float(boundary[0]),
        output_bytes=float(boundary[-1]),
    )


def batch_prefix(profile: ModelProfile, max_batch: int, objective: str = "training") -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward host-time prefix sums ``[y, j]`` for every batch y = 0..max_batch.

    Row 0 is zero: a device given no samples does no work (the interpolation of
    :meth:`ModelProfile.layer_times` would extrapolate a fixed overhead there).
    Inference has no backward: its backward sums are zero.
    """
    check_objective(objective)
    forward = np.zeros((max_batch + 1, profile.num_layers + 1))
    backward = np.zeros_like(forward)
    for y in range(1, max_batch + 1):
        f, b = profile.layer_times(y)
        forward[y, 1:] = np.cumsum(f)
        if objective == "training":
            backward[y, 1:] = np.cumsum(b)
    return forward, backward
