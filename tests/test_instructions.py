"""Device programs: typed instructions derived from a stage's schedule, checked without a model."""

from __future__ import annotations

import pytest

from ecofl.pipeline.instructions import (
    Backward,
    Forward,
    OptimizerStep,
    RecvActivation,
    SendActivation,
    SendGrad,
    check_program,
    device_program,
    program_from_json,
)
from ecofl.pipeline.schedule import ScheduleError, gpipe, one_f_one_b


def ops(program) -> list[str]:
    return [f"{i.op}{i.micro_batch if i.micro_batch >= 0 else ''}" for i in program]


def test_a_middle_stage_receives_computes_sends_and_flushes():
    schedule = one_f_one_b(3, 2, [5, 3, 1])
    program = device_program(schedule[1], 1, 3, replicated=False)
    assert ops(program) == [
        "recv_activation0", "forward0", "send_activation0", "recv_activation1", "forward1", "send_activation1",
        "recv_grad0", "backward0", "send_grad0", "recv_grad1", "backward1", "send_grad1", "optimizer_step",
    ]


def test_first_and_last_stages_load_data_and_compute_the_loss():
    schedule = gpipe(2, 2)
    first = device_program(schedule[0], 0, 2, replicated=True)
    last = device_program(schedule[1], 1, 2, replicated=False)
    assert ops(first)[:3] == ["load0", "forward0", "send_activation0"]
    assert ops(first)[-4:] == ["recv_grad1", "backward1", "reduce_grads", "optimizer_step"]
    assert ops(last) == ["recv_activation0", "forward0", "recv_activation1", "forward1",
                         "backward0", "send_grad0", "backward1", "send_grad1", "optimizer_step"]


@pytest.mark.parametrize("stages, micro, schedule", [(4, 8, "1f1b"), (3, 5, "gpipe"), (1, 3, "1f1b")])
def test_every_derived_program_checks_and_round_trips_through_json(stages, micro, schedule):
    actions = one_f_one_b(stages, micro, [2 * (stages - s) - 1 for s in range(stages)]) if schedule == "1f1b" \
        else gpipe(stages, micro)
    for s in range(stages):
        for replicated in (False, True):
            program = device_program(actions[s], s, stages, replicated)
            check_program(program, s, stages, replicated)
            assert program_from_json([i.to_json() for i in program]) == program


def broken(program, change):
    program = list(program)
    change(program)
    return tuple(program)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: p.remove(RecvActivation(0)), "before its recv_activation"),
        (lambda p: p.insert(0, p.pop(p.index(SendActivation(1)))), "before its forward"),
        (lambda p: [p.remove(Backward(1)), p.remove(SendGrad(1))], "have a forward but no backward"),
        (lambda p: p.remove(SendGrad(0)), "no send_grad"),
        (lambda p: p.insert(3, Forward(0)), "repeated"),
        (lambda p: p.insert(0, p.pop()), "the flush must come last"),
        (lambda p: p.pop(), "must end with the optimizer step"),
        (lambda p: p.insert(-1, OptimizerStep()), "the flush must come last"),
    ],
)
def test_a_malformed_program_is_refused(change, message):
    program = device_program(one_f_one_b(3, 3, [5, 3, 1])[1], 1, 3, replicated=False)
    with pytest.raises(ScheduleError, match=message):
        check_program(broken(program, change), 1, 3, replicated=False)


def test_instructions_of_another_stage_and_unknown_ones_are_refused():
    first = device_program(gpipe(2, 1)[0], 0, 2, replicated=False)
    with pytest.raises(ScheduleError, match="not an instruction of this stage"):
        check_program(first, 1, 2, replicated=False)  # stage 1 has no load
    with pytest.raises(ScheduleError, match="not an instruction of this stage"):
        check_program(device_program(gpipe(2, 1)[0], 0, 2, replicated=True), 0, 2, replicated=False)
    with pytest.raises(ScheduleError, match="unknown instruction"):
        program_from_json([{"op": "rm -rf", "micro_batch": 0}])
