"""A survivor stops between layers: the abort is checked before each layer's forward and after its backward."""

import pytest
import torch
from torch import nn

from ecofl.net.links import RoundAborted
from ecofl.pipeline.runtime.layer_abort import abort_between_layers


class Layer(nn.Linear):
    """A layer that records when it computes its forward."""

    def __init__(self, log: list[str], name: str):
        super().__init__(4, 4)
        self.log, self.name = log, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(f"forward {self.name}")
        return super().forward(x)


def stage_and_log() -> tuple[nn.Sequential, list[str]]:
    log: list[str] = []
    return nn.Sequential(*(Layer(log, str(i)) for i in range(4))), log


def aborting_at(check: int, log: list[str]):
    """An abort check that records each call and raises at call ``check`` (1-based)."""

    def abort() -> None:
        log.append("check")
        if log.count("check") == check:
            raise RoundAborted(7)

    return abort


def test_a_forward_stops_before_the_next_layer():
    stage, log = stage_and_log()
    with pytest.raises(RoundAborted), abort_between_layers(stage, aborting_at(3, log)):
        stage(torch.randn(2, 4))
    assert log == ["check", "forward 0", "check", "forward 1", "check"]  # layers 2 and 3 never ran


def test_a_backward_stops_after_the_layer_it_is_in():
    stage, log = stage_and_log()
    x = torch.randn(2, 4, requires_grad=True)  # a received activation, as on every stage but the first
    with abort_between_layers(stage, aborting_at(6, log)):
        out = stage(x)  # four checks before the four forwards
        with pytest.raises(RoundAborted) as stopped:
            out.sum().backward()  # check 5 after layer 3's backward, check 6 after layer 2's
    assert stopped.value.args == (7,)
    assert stage[3].weight.grad is not None and stage[2].weight.grad is not None
    assert stage[1].weight.grad is None and stage[0].weight.grad is None and x.grad is None


def test_the_hooks_leave_with_the_block():
    stage, log = stage_and_log()
    with abort_between_layers(stage, aborting_at(100, log)):
        stage(torch.randn(2, 4))
    log.clear()
    stage(torch.randn(2, 4, requires_grad=True)).sum().backward()  # the layers serve a later epoch's stage
    assert "check" not in log
