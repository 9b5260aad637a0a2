"""Schedules as plain data and the validator that checks them without a model."""

import json

import pytest

from ecofl.pipeline.plan import Plan, ScheduleKind, StagePlan
from ecofl.pipeline.schedule import (
    Action,
    ActionKind,
    ScheduleError,
    default_in_flight,
    eq3_in_flight,
    gpipe,
    one_f_one_b,
    validate,
)


@pytest.mark.parametrize("stages", [1, 2, 3, 6])
@pytest.mark.parametrize("micro_batches", [1, 2, 5, 16])
def test_validator_accepts_1f1b_and_gpipe(stages, micro_batches):
    for in_flight in (default_in_flight(stages), [stages - s for s in range(stages)], [1] * stages):
        validate(one_f_one_b(stages, micro_batches, in_flight), micro_batches, in_flight)
    validate(gpipe(stages, micro_batches), micro_batches)
    validate(gpipe(stages, micro_batches), micro_batches, [micro_batches] * stages)


def test_1f1b_warms_up_then_alternates_then_drains():
    schedule = one_f_one_b(2, 5, [3, 1])
    assert [(a.kind, a.micro_batch) for a in schedule[0]] == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("F", 4), ("B", 2), ("B", 3), ("B", 4)
    ]
    assert [(a.kind, a.micro_batch) for a in schedule[1]] == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3), ("F", 4), ("B", 4)
    ]
    assert all(a.stage == s for s, actions in enumerate(schedule) for a in actions)


def test_gpipe_runs_all_forwards_first():
    actions = gpipe(3, 4)[1]
    assert [a.kind for a in actions] == ["F"] * 4 + ["B"] * 4


def test_default_in_flight_is_eco_fl_eq3_with_communication():
    assert default_in_flight(4) == [7, 5, 3, 1]


def test_eq3_special_cases_and_slow_stages():
    ones = [1.0] * 4
    assert eq3_in_flight(ones, ones, [0.0] * 3, [0.0] * 3) == [4, 3, 2, 1]  # P_s = S - s
    assert eq3_in_flight(ones, ones, [1.0] * 3, [1.0] * 3) == [7, 5, 3, 1]  # P_s = 2(S - s) - 1
    # a stage feeding a twice-as-fast one needs more tasks in flight
    assert eq3_in_flight([2.0, 1.0], [2.0, 1.0], [0.0], [0.0]) == [3, 1]


def test_rejects_missing_backward():
    schedule = one_f_one_b(2, 3, [3, 1])
    schedule[1].remove(Action(1, "B", 2))
    with pytest.raises(ScheduleError, match="missing"):
        validate(schedule, 3)


def test_rejects_duplicate_action():
    schedule = gpipe(2, 2)
    schedule[0].append(Action(0, "F", 1))
    with pytest.raises(ScheduleError, match="duplicate"):
        validate(schedule, 2)


def test_rejects_backward_before_its_forward():
    schedule = gpipe(2, 2)
    schedule[0] = [Action(0, "F", 0), Action(0, "B", 1), Action(0, "F", 1), Action(0, "B", 0)]
    with pytest.raises(ScheduleError, match="precedes"):
        validate(schedule, 2)


def test_rejects_deadlocking_order():
    schedule = [
        [Action(0, "F", 0), Action(0, "B", 0), Action(0, "F", 1), Action(0, "B", 1)],
        [Action(1, "F", 0), Action(1, "F", 1), Action(1, "B", 0), Action(1, "B", 1)],
    ]
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(schedule, 2)


def test_1f1b_never_warms_up_beyond_a_predecessor():
    # stage 1 may hold 3 but stage 0 only 1: warming up 3 would deadlock
    schedule = one_f_one_b(3, 6, [1, 3, 1])
    validate(schedule, 6, [1, 3, 1])
    assert [a.kind for a in schedule[1][:2]] == ["F", "B"]
    for stages, micro_batches, in_flight in [(4, 9, [2, 5, 4, 3]), (5, 3, [9, 1, 7, 2, 2]), (3, 12, [5, 5, 5])]:
        validate(one_f_one_b(stages, micro_batches, in_flight), micro_batches, in_flight)


def test_rejects_too_many_in_flight():
    with pytest.raises(ScheduleError, match="resident"):
        validate(gpipe(3, 8), 8, default_in_flight(3))
    with pytest.raises(ScheduleError, match="resident"):
        validate(one_f_one_b(2, 8, [3, 1]), 8, [2, 1])


def test_rejects_foreign_and_out_of_range_actions():
    schedule = gpipe(2, 2)
    schedule[1][0] = Action(0, "F", 0)
    with pytest.raises(ScheduleError, match="foreign"):
        validate(schedule, 2)
    with pytest.raises(ScheduleError, match="out of range"):
        validate(gpipe(2, 3), 2)


def test_bad_sizes():
    with pytest.raises(ScheduleError):
        one_f_one_b(2, 0, [1, 1])
    with pytest.raises(ScheduleError):
        one_f_one_b(2, 4, [1])
    with pytest.raises(ScheduleError):
        one_f_one_b(2, 4, [0, 1])


def test_action_kinds_round_trip_through_their_compact_form():
    """As torch's _ComputationType: str(kind) is the short form, from_str parses it; it is the JSON form too."""
    assert str(ActionKind.FORWARD) == "F" and str(ActionKind.BACKWARD) == "B"
    for kind in ActionKind:
        assert ActionKind.from_str(str(kind)) is kind and json.loads(json.dumps(kind)) == str(kind)
    assert {a.kind for a in one_f_one_b(2, 3, [2, 1])[0]} == {ActionKind.FORWARD, ActionKind.BACKWARD}
    assert Action(0, "F", 1) == Action(0, ActionKind.FORWARD, 1)  # a hand-written action compares as built
    with pytest.raises(ValueError, match="unknown action kind 'X'; valid: F, B, send, recv, allreduce, step, output"):
        ActionKind.from_str("X")


def test_a_plan_holds_its_schedule_kind_and_refuses_an_unknown_one():
    stages = (StagePlan((0, 1), (0,), (4,), 1),)
    for kind in ScheduleKind:
        plan = Plan("hand", stages, 4, 2, schedule=str(kind))
        assert plan.schedule is kind and json.loads(json.dumps(plan.to_dict()))["schedule"] == str(kind)
    assert Plan("hand", stages, 4, 2).schedule is ScheduleKind.ONE_F_ONE_B
    with pytest.raises(ValueError, match="unknown schedule 'pipedream'; valid: 1f1b, gpipe, async-1f1b, stream"):
        Plan("hand", stages, 4, 2, schedule="pipedream")
