"""Pipeline schedules as plain data, and a validator that runs no model.

A schedule is one ordered action list per stage; an :class:`Action` is a
forward (``F``) or backward (``B``) pass of one micro-batch on one stage. The
executor (runtime or cost model) runs each stage's list in order and only
waits for data: F(s, m) needs F(s-1, m); B(s, m) needs B(s+1, m) and F(s, m).

- :func:`one_f_one_b`: 1F1B-Sync (Eco-FL §4.3, Fig. 3/4; Asteroid Fig. 4b):
  stage s runs K_s forward tasks (warm-up), then one backward one forward,
  then drains its backwards; weights update once at the flush.
- :func:`gpipe`: backward after forward (GPipe's BAF-Sync), the memory baseline.
- :func:`async_one_f_one_b`: PipeDream's asynchronous 1F1B (FTPipeHD §III-C):
  S - s forwards in flight on stage s and no flush; the weight updates after
  every backward are the program's (:func:`ecofl.pipeline.instructions.async_program`).
- :func:`default_in_flight`: P_s = 2(S - s) - 1 (Eco-FL eq. 3 with
  non-negligible communication; Asteroid's K_p).
- :func:`eq3_in_flight`: the iterative bound of Eco-FL eq. 3 from stage times.

:class:`ActionKind` names what a device does: a schedule's passes and, in a
timeline (:mod:`ecofl.pipeline.timeline`), its transfers and its flush.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import NamedTuple, Sequence


class ScheduleError(ValueError):
    """A schedule that is incomplete, out of order, deadlocks, or holds too much."""


class ActionKind(StrEnum):
    """What a device does. As torch.distributed.pipelining's ``_ComputationType``, a kind has a compact form
    that round-trips: ``str(kind)`` (``"F"``), parsed by :meth:`from_str`; it is the kind's JSON form too."""

    FORWARD = "F"
    BACKWARD = "B"
    SEND = "send"  # a transfer out: activations, gradients, a stream's inputs or outputs
    RECV = "recv"  # a transfer in
    ALLREDUCE = "allreduce"  # the flush's gradient all-reduce inside a replicated stage
    STEP = "step"  # an optimizer step
    OUTPUT = "output"  # a stream's results delivered to the portal

    @classmethod
    def from_str(cls, text: str) -> ActionKind:
        """The kind ``text`` names; ValueError naming the valid ones."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown action kind {text!r}; valid: {', '.join(cls)}") from None


class ScheduleKind(StrEnum):
    """How a plan's stages run: the key of its mode (:mod:`ecofl.pipeline.modes`). ``str(kind)`` is the form
    configs, the CLI and plan JSON use."""

    ONE_F_ONE_B = "1f1b"  # 1F1B-Sync (Eco-FL §4.3): K_s forwards in flight, weights update at the flush
    GPIPE = "gpipe"  # backward after forward (GPipe's BAF-Sync)
    ASYNC_ONE_F_ONE_B = "async-1f1b"  # PipeDream's 1F1B as FTPipeHD runs it: a step after every backward
    STREAM = "stream"  # inference (PipeEdge): forward only, no flush

    @classmethod
    def from_str(cls, text: str) -> ScheduleKind:
        """The kind ``text`` names; ValueError naming the valid ones."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"unknown schedule {text!r}; valid: {', '.join(cls)}") from None


#: The kinds a schedule's actions have: the model's passes.
PASSES: tuple[ActionKind, ...] = (ActionKind.FORWARD, ActionKind.BACKWARD)


class Action(NamedTuple):
    stage: int
    kind: ActionKind  # a pass: FORWARD or BACKWARD
    micro_batch: int


Schedule = list[list[Action]]


def one_f_one_b(num_stages: int, num_micro_batches: int, in_flight: Sequence[int]) -> Schedule:
    """1F1B-Sync: W_s forwards, then alternate B and F, then drain the Bs.

    W_s = min(K_0, ..., K_s, M): a micro-batch resident on stage s (forward
    done, backward not) is resident on every earlier stage too, so a stage can
    never hold more than its predecessors; warming up beyond that would wait
    for a forward that only comes after a backward it blocks (deadlock).
    """
    _check_sizes(num_stages, num_micro_batches)
    if len(in_flight) != num_stages:
        raise ScheduleError(f"need one in-flight bound per stage ({num_stages}), got {len(in_flight)}")
    schedule: Schedule = []
    for s, k in enumerate(in_flight):
        if k < 1:
            raise ScheduleError(f"stage {s}: in-flight bound must be at least 1, got {k}")
        warm = warmup_forwards(in_flight, s, num_micro_batches)
        actions = [Action(s, ActionKind.FORWARD, m) for m in range(warm)]
        for m in range(num_micro_batches - warm):
            actions.append(Action(s, ActionKind.BACKWARD, m))
            actions.append(Action(s, ActionKind.FORWARD, warm + m))
        actions.extend(Action(s, ActionKind.BACKWARD, m) for m in range(num_micro_batches - warm, num_micro_batches))
        schedule.append(actions)
    return schedule


def async_one_f_one_b(num_stages: int, num_micro_batches: int) -> Schedule:
    """PipeDream's 1F1B as FTPipeHD runs it (§III-C): stage s keeps S - s forwards in flight (PipeDream's
    NOAM in a straight pipeline), then alternates one backward and one forward, then drains.

    The order of passes is 1F1B-Sync's with K_s = S - s; what makes it
    asynchronous is that a stage updates its weights after every backward
    instead of once at a flush, so a micro-batch's forward may see weights
    that later micro-batches' updates already changed, and its backward must
    use the weights its forward used (weight stashing).
    """
    return one_f_one_b(num_stages, num_micro_batches, [num_stages - s for s in range(num_stages)])


def gpipe(num_stages: int, num_micro_batches: int) -> Schedule:
    """GPipe (backward after forward): every forward, then every backward."""
    _check_sizes(num_stages, num_micro_batches)
    return [
        [Action(s, ActionKind.FORWARD, m) for m in range(num_micro_batches)]
        + [Action(s, ActionKind.BACKWARD, m) for m in range(num_micro_batches)]
        for s in range(num_stages)
    ]


def target_in_flight(num_stages: int, stage: int) -> int:
    """P_s = 2(S - s) - 1: Eco-FL eq. 3 when communication is as slow as compute (Asteroid §3.2's K_p)."""
    return 2 * (num_stages - stage) - 1


def default_in_flight(num_stages: int) -> list[int]:
    """P_s of every stage (:func:`target_in_flight`)."""
    return [target_in_flight(num_stages, s) for s in range(num_stages)]


def warmup_forwards(in_flight: Sequence[int], stage: int, num_micro_batches: int) -> int:
    """W_s = min(K_0, ..., K_s, M): the forwards stage s runs before its first backward, and the most it
    holds at once under 1F1B-Sync (see :func:`one_f_one_b`)."""
    return min(min(in_flight[: stage + 1]), num_micro_batches)


def eq3_in_flight(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    send_forward_s: Sequence[float],
    send_backward_s: Sequence[float],
) -> list[int]:
    """The smallest P_s satisfying Eco-FL eq. 3, from the last stage backwards.

    P_{S-1} = 1 and P_s = P_{s+1} + ceil((T_f^s + T_b^s + T_cf^s + T_cb^s) / (T_f^{s+1} + T_b^{s+1})),
    with per-micro-batch compute times T_f, T_b of each stage and T_cf^s, T_cb^s
    the activation / gradient transfer times between stages s and s+1 (the
    paper prints the recursion shifted by one index, with a denominator that
    would not exist for the last stage; this is the reading that gives its
    stated special cases P_s = S - s without communication and 2(S - s) - 1
    when each transfer takes as long as a stage's compute, in a balanced
    pipeline). ``send_*`` have S - 1 entries.
    """
    num_stages = len(forward_s)
    if not (len(backward_s) == num_stages and len(send_forward_s) == len(send_backward_s) == num_stages - 1):
        raise ScheduleError("eq3_in_flight needs S compute times and S - 1 transfer times per direction")
    bounds = [1] * num_stages
    for s in range(num_stages - 2, -1, -1):
        downstream = forward_s[s + 1] + backward_s[s + 1]
        if not downstream > 0:
            raise ScheduleError(f"stage {s + 1} has no compute time; eq. 3 is undefined")
        ratio = (forward_s[s] + backward_s[s] + send_forward_s[s] + send_backward_s[s]) / downstream
        bounds[s] = bounds[s + 1] + math.ceil(ratio - 1e-9)
    return bounds


def validate(schedule: Schedule, num_micro_batches: int, in_flight: Sequence[int] | None = None) -> None:
    """Raise :class:`ScheduleError` unless ``schedule`` is a complete, runnable schedule.

    Checks each stage's list holds exactly one F and one B of every
    micro-batch, each B after its own F, resident activations (F done, B not)
    never above ``in_flight[s]``, and that the stages can run together without
    deadlock (simulated with dependency resolution and unbounded time).
    """
    num_stages = len(schedule)
    _check_sizes(num_stages, num_micro_batches)
    if in_flight is not None and len(in_flight) != num_stages:
        raise ScheduleError(f"need one in-flight bound per stage ({num_stages}), got {len(in_flight)}")
    expected = {(kind, m) for kind in PASSES for m in range(num_micro_batches)}
    for s, actions in enumerate(schedule):
        seen: set[tuple[ActionKind, int]] = set()
        resident = 0
        for action in actions:
            if action.stage != s or action.kind not in PASSES:
                raise ScheduleError(f"stage {s}: foreign or malformed action {action}")
            key = (action.kind, action.micro_batch)
            if key not in expected:
                raise ScheduleError(f"stage {s}: micro-batch {action.micro_batch} out of range")
            if key in seen:
                raise ScheduleError(f"stage {s}: duplicate {action}")
            if action.kind == ActionKind.BACKWARD and (ActionKind.FORWARD, action.micro_batch) not in seen:
                raise ScheduleError(f"stage {s}: {action} precedes its forward")
            seen.add(key)
            resident += 1 if action.kind == ActionKind.FORWARD else -1
            if in_flight is not None and resident > in_flight[s]:
                raise ScheduleError(
                    f"stage {s}: {resident} forward tasks resident after {action}, bound is {in_flight[s]}"
                )
        missing = expected - seen
        if missing:
            kind, m = min(missing, key=lambda k: (k[1], k[0]))
            raise ScheduleError(f"stage {s}: missing {Action(s, kind, m)} ({len(missing)} actions missing)")
    _check_deadlock(schedule)


def _check_deadlock(schedule: Schedule) -> None:
    """Run every stage's list in order, each action once its inputs exist."""
    num_stages = len(schedule)
    done: set[Action] = set()
    position = [0] * num_stages
    progress = True
    while progress:
        progress = False
        for s, actions in enumerate(schedule):
            while position[s] < len(actions) and _inputs_ready(actions[position[s]], num_stages, done):
                done.add(actions[position[s]])
                position[s] += 1
                progress = True
    stuck = [actions[position[s]] for s, actions in enumerate(schedule) if position[s] < len(actions)]
    if stuck:
        raise ScheduleError(f"deadlock: every stage waits; next actions {stuck}")


def _inputs_ready(action: Action, num_stages: int, done: set[Action]) -> bool:
    s, kind, m = action
    if kind == ActionKind.FORWARD:
        return s == 0 or Action(s - 1, ActionKind.FORWARD, m) in done
    downstream = s == num_stages - 1 or Action(s + 1, ActionKind.BACKWARD, m) in done
    return Action(s, ActionKind.FORWARD, m) in done and downstream


def _check_sizes(num_stages: int, num_micro_batches: int) -> None:
    if num_stages < 1 or num_micro_batches < 1:
        raise ScheduleError(
            f"need at least one stage and one micro-batch, got S={num_stages}, M={num_micro_batches}"
        )
