"""What a stage's links cost its device's CPU, timed with its compute in the device's cgroup.

A worker's tensors travel on sealed links (:class:`ecofl.net.links.PeerLink`):
a sender thread frames and seals each tensor (AES-GCM) and a reader thread
receives and opens it. On a confined device those threads spend the same
CPU quota as the stage's forwards and backwards. On Eco-FL's 3-stage testbed
(MobileNetV2, 32 micro-batches of 2; benchmarks/results/confined.json,
2026-12-01 17:18) a Jetson Nano's link threads spent 0.07 CPU-s a
sync-round, 0.7 s at its 0.1 cores: that was the part of its measured
compute the cost model had not predicted (0.81 s of 7.02 s).

So a device calibrating its stage (:mod:`.calibration`) carries, after each
training step, the tensors its links carry for one micro-batch through a
real pair of sealed links inside its own process (:class:`LoopbackLinks`).
Each tensor crossing the pair is sealed once and opened once, as one a
device sends plus one it receives:

- a stage after the first receives its input and sends back the input's
  gradient, both of the input's size: one carry of the input;
- a stage before the last sends its output and receives the output's
  gradient: one carry of the output.

A stage streaming inference (PipeEdge) opens its input and seals its
output, one carry: of its output, or, on the last stage, of its input.

Its step time then holds its links' CPU at its own pace, and its speed
(:func:`.calibration.speed_from_step`) carries it into the plan and the
cost model. A device timing the whole model sends nothing and carries
nothing.
"""

from __future__ import annotations

import os
import socket

import torch

from ecofl.net.links import PeerLink
from ecofl.net.sealed import SealedSocket

KEY_BYTES = 32  # AES-256-GCM, as the home's channels (ecofl.net.sealed)
CARRY_TIMEOUT_S = 60.0


def carried_per_step(stage_input: torch.Tensor, stage_output: torch.Tensor, first_layer: int, is_last: bool,
                     objective: str = "training") -> list[torch.Tensor]:
    """The tensors one step's links seal and open once each (see the module docstring); ``objective``:
    ``training`` or ``inference``."""
    receives, sends = first_layer > 0, not is_last
    if objective == "inference":
        return [stage_output] if sends else [stage_input] if receives else []
    return [tensor for tensor, used in ((stage_input, receives), (stage_output, sends)) if used]


class LoopbackLinks:
    """Two sealed links joined by a socket pair in this process: what one end posts, the other takes."""

    def __init__(self) -> None:
        near, far = socket.socketpair()
        forward, backward = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
        self._sending = PeerLink(SealedSocket(near, forward, backward), peer=0)
        self._receiving = PeerLink(SealedSocket(far, backward, forward), peer=0)

    def carry(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Send each tensor across and take it at the other end (sealed, sent, received and opened)."""
        for tag, tensor in enumerate(tensors):
            self._sending.post(tensor, tag)
        return [self._receiving.take(tag, CARRY_TIMEOUT_S) for tag in range(len(tensors))]

    def close(self) -> None:
        self._sending.close()
        self._receiving.close()

    def __enter__(self) -> "LoopbackLinks":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
