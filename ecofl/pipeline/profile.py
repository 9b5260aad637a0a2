"""Per-layer profile of a model: what the planner and the cost model know of it.

Times are host seconds (one host core) per *micro-batch* at the measured batch
sizes; a device runs them ``1 / device.speed`` times as long (ecofl.devices).
The relation of time to batch size is not linear (Asteroid Fig. 6), so times
are interpolated piecewise-linearly between measured sizes and extrapolated
from the last two beyond them.

Byte counts are per *sample* unless named otherwise:

- ``activation_bytes[l]``: layer l's output (a_l, sent forward at a cut after l);
- ``gradient_bytes[l]``: the gradient w.r.t. layer l's input (b_l, sent backward
  at a cut before l);
- ``stash_bytes[l]``: what layer l keeps resident from its forward until its
  backward (saved tensors): ACT of Asteroid eq. 3 is the sum over a stage;
- ``weight_bytes[l]``, ``optimizer_bytes[l]``: per layer, not per sample
  (MOD and OPT of Asteroid eq. 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ecofl.devices import DeviceSpec


@dataclass(frozen=True)
class ModelProfile:
    """Measured or derived per-layer costs of one model (L layers, B batch sizes)."""

    model: str
    layer_names: tuple[str, ...]
    batch_sizes: tuple[int, ...]  # increasing, at least one
    forward_s: np.ndarray  # [L, B] host seconds per micro-batch of batch_sizes[b]
    backward_s: np.ndarray  # [L, B]
    activation_bytes: np.ndarray  # [L] per sample
    gradient_bytes: np.ndarray  # [L] per sample
    stash_bytes: np.ndarray  # [L] per sample
    weight_bytes: np.ndarray  # [L]
    optimizer_bytes: np.ndarray  # [L]
    flops: np.ndarray  # [L] forward FLOPs per sample
    input_bytes: int  # one input sample (what the portal sends to stage 0)
    optimizer_step_s: np.ndarray | None = None  # [L] host seconds of one optimizer step; None = free

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    def layer_times(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """Host forward and backward seconds of every layer for a micro-batch of ``batch``."""
        return _interpolate(self.batch_sizes, self.forward_s, batch), _interpolate(
            self.batch_sizes, self.backward_s, batch
        )


def device_times(profile: ModelProfile, device: DeviceSpec, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of every layer on ``device`` for a micro-batch of ``batch``.

    The host's interpolated times t_f^l(beta), t_b^l(beta) scaled by 1 / device.speed
    (Asteroid §3.3 profiles t_f^{d,l}(beta) on each device; we scale the host's).
    """
    forward, backward = profile.layer_times(batch)
    return forward / device.speed, backward / device.speed


def _interpolate(sizes: tuple[int, ...], times: np.ndarray, batch: int) -> np.ndarray:
    """Piecewise-linear in batch size through the measured points, linear beyond them."""
    if len(sizes) == 1:
        return times[:, 0] * (batch / sizes[0])
    x = np.asarray(sizes, dtype=float)
    i = int(np.clip(np.searchsorted(x, batch) - 1, 0, len(x) - 2))
    w = (batch - x[i]) / (x[i + 1] - x[i])
    return np.maximum(times[:, i] + w * (times[:, i + 1] - times[:, i]), 0.0)
