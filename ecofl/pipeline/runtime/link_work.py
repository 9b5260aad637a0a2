"""What a stage's links cost its device's CPU, timed with its compute in the device's cgroup.

A worker's tensors travel on sealed links (:class:`ecofl.net.links.PeerLink`):
a sender thread frames and seals each tensor (AES-GCM) and a reader thread
receives and opens it. On a confined device those threads spend the same
CPU quota as the stage's forwards and backwards. On Eco-FL's 3-stage testbed
(MobileNetV2, 32 micro-batches of 2; benchmarks/results/confined.json,
2026-12-01 17:18) a Jetson Nano's link threads spent 0.07 CPU-s a
sync-round, 0.7 s at its 0.1 cores: that was the part of its measured
compute the cost model had not predicted (0.81 s of 7.02 s).

So a device calibrating its stage (:mod:`.calibration`) makes, after each of
its passes, the hand-offs its stage makes after that pass in the pipeline,
through a real pair of sealed links inside its own process
(:class:`LoopbackLinks`): posted to the sender thread, waited for until it
has left as a device of less than one core waits (:mod:`.hand_off`), and
opened at the other end while the next pass runs, as a stage's reader
thread opens what it receives. Each tensor crossing the pair is sealed
once and opened once, as one a device sends plus one it receives:

- a stage before the last, after its forward: its output (which it sends;
  it receives the output's gradient of that size);
- a stage after the first, after its backward: its input's gradient (which
  it sends back; it received the input of that size).

A stage streaming inference (PipeEdge) opens its input and seals its
output, one hand-off after its forward: of its output, or, on the last
stage, of its input.

The pattern is the pipeline's, not a loop's: a pass, then its hand-off's
wake-ups in the device's throttled cgroup, then the next pass. On the mixed
home's Raspberry Pi (0.025 cores, a CFS period of 40 ms), a stage sharing
MobileNetV2's layers 16-21 at one sample ran 0.03 s a micro-batch between
its passes in the pipeline that its calibration, which carried both
tensors after a step of both passes, had not timed (docs/pipeline.md, "The
mixed home's CLI runs").

Its step time then holds its links' CPU at its own pace, and its speed
(:func:`.calibration.speed_from_step`) carries it into the plan and the
cost model. A device timing the whole model sends nothing and carries
nothing.
"""

from __future__ import annotations

import os
import socket

import torch

from ecofl.net.links import PeerLink, never_aborted
from ecofl.net.sealed import SealedSocket
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.hand_off import hand_off_first

KEY_BYTES = 32  # AES-256-GCM, as the home's channels (ecofl.net.sealed)
CARRY_TIMEOUT_S = 60.0


def hand_offs_per_pass(stage_input: torch.Tensor, stage_output: torch.Tensor, first_layer: int, is_last: bool,
                       objective: str = "training") -> list[list[torch.Tensor]]:
    """For each of a step's passes (training: forward, backward; inference: forward), the tensors its
    hand-offs seal and open once each (see the module docstring); ``objective``: ``training`` or ``inference``."""
    receives, sends = first_layer > 0, not is_last
    if objective == "inference":
        return [[stage_output] if sends else [stage_input] if receives else []]
    return [[stage_output] if sends else [], [stage_input] if receives else []]


class LoopbackLinks:
    """Two sealed links joined by a socket pair in this process: what one end posts, the other takes."""

    def __init__(self) -> None:
        near, far = socket.socketpair()
        forward, backward = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
        self._sending = PeerLink(SealedSocket(near, forward, backward), peer=0)
        self._receiving = PeerLink(SealedSocket(far, backward, forward), peer=0)
        self._in_flight = 0  # hand-offs not yet collected at the other end

    def hand_off(self, tensor: torch.Tensor, pace: CpuPace) -> None:
        """Send ``tensor`` across as a stage hands it off: sealed and written, on a device of less than one core
        (``pace``) waited for until it has left. The other end opens it meanwhile, as a stage's reader thread
        opens what it receives while the stage computes on (:meth:`received` collects it)."""
        hand_off_first(pace, [self._sending.post(tensor, self._in_flight)], CARRY_TIMEOUT_S, never_aborted)
        self._in_flight += 1

    def received(self) -> list[torch.Tensor]:
        """What the other end opened of the hand-offs since the last call, in their order (waiting for any
        still on its way)."""
        got = [self._receiving.take(tag, CARRY_TIMEOUT_S) for tag in range(self._in_flight)]
        self._in_flight = 0
        return got

    def close(self) -> None:
        self._sending.close()
        self._receiving.close()

    def __enter__(self) -> "LoopbackLinks":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
