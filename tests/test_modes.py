"""The pipeline's modes (ecofl.pipeline.modes): one object per schedule kind, found by the registry, each
consistent in what it says of itself (its action lists, device programs and memory), run without a model."""

from __future__ import annotations

import pytest

from ecofl.pipeline.modes import MODES, mode_of
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.schedule import ActionKind, ScheduleKind, default_in_flight, validate

TRAINING = [kind for kind in ScheduleKind if kind != ScheduleKind.STREAM]


def plan_of(kind: ScheduleKind | str, num_stages: int = 3, num_micro_batches: int = 5, devices_per_stage: int = 1,
            in_flight: list[int] | None = None) -> Plan:
    in_flight = in_flight or default_in_flight(num_stages)
    stages, device = [], 0
    for s in range(num_stages):
        devices = tuple(range(device, device + devices_per_stage))
        device += devices_per_stage
        stages.append(StagePlan((s, s), devices, (4 // devices_per_stage,) * devices_per_stage, in_flight[s]))
    return Plan("test", tuple(stages), micro_batch=4, num_micro_batches=num_micro_batches, schedule=kind)


def test_every_kind_has_its_mode_found_from_a_plan_a_kind_or_its_name():
    assert set(MODES) == set(ScheduleKind)
    for kind in ScheduleKind:
        plan = plan_of(kind)
        assert mode_of(plan) is mode_of(kind) is mode_of(str(kind)) is MODES[kind] and mode_of(plan).kind == kind
    with pytest.raises(ValueError, match="unknown schedule 'pipedream'; valid: 1f1b, gpipe, async-1f1b, stream"):
        mode_of("pipedream")


@pytest.mark.parametrize("kind", TRAINING)
@pytest.mark.parametrize("num_stages,num_micro_batches", [(1, 1), (2, 3), (3, 5), (4, 2), (5, 8)])
def test_a_training_modes_actions_are_runnable_and_hold_what_its_memory_model_says(kind, num_stages,
                                                                                 num_micro_batches):
    """The action lists validate (within the bounds the mode says they keep), and each stage's most resident
    forwards in them are the mode's resident_forwards (Asteroid eq. 3's K_p) and its device program's bound (a
    bound for any call where the worker builds the program per call)."""
    plan = plan_of(kind, num_stages, num_micro_batches)
    mode = mode_of(plan)
    schedule = mode.actions(plan)
    validate(schedule, num_micro_batches, mode.validated_in_flight(plan))
    for s, actions in enumerate(schedule):
        resident = most = 0
        for action in actions:
            resident += 1 if action.kind == ActionKind.FORWARD else -1
            most = max(most, resident)
        assert most == mode.resident_forwards(plan, s), (kind, s)
        program, bound = mode.stage_program(plan, schedule, s)
        assert (program == ()) == mode.programs_per_call
        if mode.programs_per_call:  # a bound for a call of any length (asynchronous 1F1B: S - s)
            assert bound >= most
        else:
            assert bound == most


def test_only_asynchronous_1f1b_steps_per_backward_keeps_weight_versions_and_passes_many_rounds_at_once():
    plan = plan_of(ScheduleKind.ASYNC_ONE_F_ONE_B, num_stages=3)
    mode = mode_of(plan)
    assert mode.steps_after_every_backward and mode.rounds_per_pass(4) == 4
    assert [mode.version_window(3, s) for s in range(3)] == [3, 2, 1]  # S - s (FTPipeHD §III-C)
    assert mode.request_batch_size(plan) == plan.micro_batch  # every micro-batch its own update
    for kind in (ScheduleKind.ONE_F_ONE_B, ScheduleKind.GPIPE):
        synchronous = mode_of(kind)
        assert not synchronous.steps_after_every_backward and synchronous.rounds_per_pass(4) == 1
        assert synchronous.version_window(3, 0) == 0 and synchronous.request_batch_size(plan) == plan.batch_size


def test_each_mode_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="one device per stage"):
        plan_of(ScheduleKind.ASYNC_ONE_F_ONE_B, devices_per_stage=2)
    assert mode_of(plan_of(ScheduleKind.ONE_F_ONE_B, devices_per_stage=2)).kind == ScheduleKind.ONE_F_ONE_B
    with pytest.raises(ValueError, match="no sync-rounds to replay"):
        mode_of(ScheduleKind.ASYNC_ONE_F_ONE_B).check_training(fault_tolerance=True)
    mode_of(ScheduleKind.ONE_F_ONE_B).check_training(fault_tolerance=True)
    stream = plan_of(ScheduleKind.STREAM)
    assert stream.objective == "inference" and mode_of(stream).programs_per_call
    with pytest.raises(ValueError, match="'stream' plan is for inference: it has no sync-round"):
        mode_of(stream).actions(stream)
    assert mode_of(stream).stage_program(stream, None, 1) == ((), stream.stages[1].in_flight)
