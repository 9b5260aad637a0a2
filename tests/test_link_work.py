"""A confined device's calibration makes the hand-offs its stage makes, after the passes it makes them after
(ecofl.pipeline.runtime.link_work)."""

from __future__ import annotations

import io
import json
import sys
import threading

import pytest
import torch

from ecofl.pipeline.runtime import device_timing
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.host_overhead import record_path, runtime_overheads
from ecofl.pipeline.runtime.link_work import LoopbackLinks, hand_offs_per_pass
from ecofl.pipeline.runtime.model_spec import LayerList
from ecofl.pipeline.runtime.pipe_messages import CALIBRATION_REPLIES, Go, line_of, read_line

INPUT, OUTPUT = torch.zeros(2, 3), torch.ones(2, 5)


@pytest.mark.parametrize("first, is_last, objective, carried", [
    (0, True, "training", [[], []]),  # the whole model: no links
    (0, False, "training", [[OUTPUT], []]),  # the first stage sends its output and receives its gradient
    (2, False, "training", [[OUTPUT], [INPUT]]),  # a middle stage: its input's gradient goes back after its backward
    (2, True, "training", [[], [INPUT]]),  # the last stage receives its input, sends its gradient
    (0, True, "inference", [[]]),
    (0, False, "inference", [[OUTPUT]]),  # a stream stage seals its output...
    (2, False, "inference", [[OUTPUT]]),  # ...and opens its input: one hand-off
    (2, True, "inference", [[INPUT]]),  # the last stage only opens its input
])
def test_each_pass_is_followed_by_the_hand_offs_its_stage_makes_after_it(first, is_last, objective, carried):
    got = hand_offs_per_pass(INPUT, OUTPUT, first, is_last, objective)
    assert [[tensor is INPUT for tensor in tensors] for tensors in got] == \
        [[tensor is INPUT for tensor in tensors] for tensors in carried]


def test_loopback_links_seal_send_receive_and_open_each_tensor_and_close_their_threads():
    tensors = [torch.randn(4, 16), torch.arange(10.0).reshape(2, 5), torch.randn(64, 1024)]  # the last: records
    before = {thread.name for thread in threading.enumerate()}
    with LoopbackLinks() as links:
        for pace in (CpuPace(None), CpuPace(0.5)):  # a device of less than one core waits for each to leave
            for tensor in tensors:
                links.hand_off(tensor, pace)
            assert [torch.equal(a, b) for a, b in zip(links.received(), tensors)] == [True] * 3
            assert links.received() == []
    for thread in threading.enumerate():
        if thread.name not in before and thread.name.startswith(("send-to", "recv-from")):
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} outlived its links"


def test_a_calibrating_middle_stage_hands_off_its_output_after_each_forward_and_its_input_after_each_backward(
        monkeypatch):
    """The calibration process of a stage between two others (layers 2-3 of five): every step, its first one
    included, is a forward followed by a hand-off of its output (8 wide), then a backward followed by one of its
    input's gradient (16 wide), at its micro-batch, as the stage runs them in the pipeline."""
    model = LayerList((("Linear", {"in_features": 4, "out_features": 16}), ("ReLU", {}),
                       ("Linear", {"in_features": 16, "out_features": 8}), ("ReLU", {}),
                       ("Linear", {"in_features": 8, "out_features": 3})))
    order: list[str] = []
    hand_off, call = LoopbackLinks.hand_off, CpuPace.call

    def handed_off(self, tensor, pace):
        order.append(f"hand-off {tuple(tensor.shape)}")
        hand_off(self, tensor, pace)

    def called(self, run_pass):
        order.append(run_pass.__name__)
        return call(self, run_pass)

    monkeypatch.setattr(LoopbackLinks, "hand_off", handed_off)
    monkeypatch.setattr(CpuPace, "call", called)
    monkeypatch.setattr(sys, "argv", ["calibration", "--model", json.dumps(model.to_json()), "--input-shape", "4",
                                      "--micro-batch", "2", "--layers", "2,3", "--seconds", "0.05"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(line_of(Go())))
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    assert device_timing.main() == 0
    ready, timed = (read_line(line, CALIBRATION_REPLIES) for line in out.getvalue().splitlines())
    assert ready.seconds_per_step is None and timed.seconds_per_step > 0
    step = ["forward", "hand-off (2, 8)", "backward", "hand-off (2, 16)"]
    assert len(order) >= 4 * len(step)  # the untimed first steps and at least three timed ones
    assert order == step * (len(order) // len(step))


def test_confined_predictions_leave_the_per_byte_overhead_to_the_devices_speeds(tmp_path):
    """A confined device's calibration holds its links' CPU (above), so its prediction adds only the runtime's
    per-operation work; at host speed both overheads; sleeping devices none."""
    record_path(str(tmp_path)).write_text(json.dumps({"operation_overhead_s": 0.0006, "byte_overhead_s": 7e-10}))
    assert runtime_overheads(Emulation.CGROUP, str(tmp_path)) == {"operation_overhead_s": 0.0006}
    assert runtime_overheads(Emulation.NONE, str(tmp_path)) == {"operation_overhead_s": 0.0006,
                                                                 "byte_overhead_s": 7e-10}
    assert runtime_overheads(Emulation.SLEEP, str(tmp_path)) == {}
