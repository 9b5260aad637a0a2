"""Prefix sums over layers from which the planners read any stage's cost in O(1).

A stage covering layers ``i .. j-1`` (half-open, ``0 <= i < j <= L``) costs

- compute: ``compute[j] - compute[i]`` host seconds (forward + backward, one
  micro-batch), divided by the device's speed (:mod:`ecofl.devices`);
- memory: ``static[j] - static[i] + K * share * (stash[j] - stash[i])`` bytes,
  Asteroid eq. 3 exactly as :func:`ecofl.pipeline.cost.stage_memory_bytes`
  counts it (MOD = 2 x weights, parameters + accumulated gradients; OPT;
  K resident forward tasks of ``share`` samples);
- a cut before layer ``j`` sends ``cut_bytes[j]`` per sample: the activation
  of layer j-1 forward plus the gradient of layer j's input backward (the
  ``(a_s + b_s)`` of Eco-FL eq. 1).

Matrices ``[L+1, L+1]`` indexed ``[i, j]`` hold every stage at once so the
dynamic programmes run as numpy array operations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ecofl.pipeline.profile import ModelProfile


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=float))))


def span(prefix: np.ndarray) -> np.ndarray:
    """``[i, j] -> prefix[j] - prefix[i]`` for all i, j (only i < j is meaningful)."""
    return prefix[None, :] - prefix[:, None]


@dataclass(frozen=True)
class StageTables:
    """Per-layer prefix sums of one model at one micro-batch size."""

    micro_batch: int
    compute: np.ndarray  # [L+1] host seconds, forward + backward of a micro-batch
    static: np.ndarray  # [L+1] bytes: 2 x weights + optimizer state
    stash: np.ndarray  # [L+1] bytes resident per sample and forward task
    weights: np.ndarray  # [L+1] bytes all-reduced by a data-parallel stage (Asteroid eq. 5)
    cut_bytes: np.ndarray  # [L+1] bytes per sample crossing a cut before layer j (0 at j = 0, L)

    @property
    def num_layers(self) -> int:
        return len(self.compute) - 1

    @property
    def static_span(self) -> np.ndarray:
        return span(self.static)

    @property
    def stash_span(self) -> np.ndarray:
        return span(self.stash)

    @property
    def compute_span(self) -> np.ndarray:
        return span(self.compute)

    def valid(self) -> np.ndarray:
        """``[i, j]`` True where ``i < j``: a non-empty stage."""
        n = self.num_layers + 1
        return np.triu(np.ones((n, n), dtype=bool), k=1)


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


def stage_tables(profile: ModelProfile, micro_batch: int) -> StageTables:
    """The prefix sums of ``profile`` with micro-batches of ``micro_batch`` samples."""
    forward, backward = profile.layer_times(micro_batch)
    return StageTables(
        micro_batch=micro_batch,
        compute=_prefix(forward + backward),
        static=_prefix(static_bytes(profile)),
        stash=_prefix(profile.stash_bytes),
        weights=_prefix(profile.weight_bytes),
        cut_bytes=cut_bytes(profile),
    )


def batch_prefix(profile: ModelProfile, max_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward host-time prefix sums ``[y, j]`` for every batch y = 0..max_batch.

    Row 0 is zero: a device given no samples does no work (the interpolation of
    :meth:`ModelProfile.layer_times` would extrapolate a fixed overhead there).
    """
    forward = np.zeros((max_batch + 1, profile.num_layers + 1))
    backward = np.zeros_like(forward)
    for y in range(1, max_batch + 1):
        f, b = profile.layer_times(y)
        forward[y, 1:] = np.cumsum(f)
        backward[y, 1:] = np.cumsum(b)
    return forward, backward
