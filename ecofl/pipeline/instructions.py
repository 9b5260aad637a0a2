"""What one device does in a sync-round, as typed instructions (plain data, JSON on the wire).

A stage's schedule (:mod:`ecofl.pipeline.schedule`) says in which order a
stage runs forward and backward passes of its micro-batches. A device's
*program* spells every step out, in the manner of DeepSpeed's pipe
instructions: where a forward's input comes from (the portal's data for
stage 0, else the previous stage's devices), the pass itself, where its
output goes; the same for a backward; and the pipeline flush of Eco-FL
§4.1 (the gradient all-reduce inside a replicated stage, Asteroid §4, then
one optimizer step). The worker executes a program instruction by
instruction (:mod:`ecofl.pipeline.runtime.stage`) and knows nothing of
schedules.

:func:`device_program` derives the program of a stage's action list;
:func:`check_program` is what the worker insists on before running one it
received: every micro-batch's data arrives before the pass that needs it,
every output leaves after the pass that made it, every forward is followed
by its backward, and the flush comes last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from ecofl.pipeline.schedule import Action, ActionKind, ScheduleError


@dataclass(frozen=True)
class Instruction:
    """One step of a device's sync-round; ``micro_batch`` is -1 for the flush's steps."""

    micro_batch: int = -1
    op: ClassVar[str] = ""

    def to_json(self) -> dict:
        return {"op": self.op, "micro_batch": self.micro_batch}


@dataclass(frozen=True)
class LoadMicroBatch(Instruction):
    """Stage 0: take this micro-batch's samples from the portal's data (paced at the portal's link)."""

    op: ClassVar[str] = "load"


@dataclass(frozen=True)
class RecvActivation(Instruction):
    """Receive the micro-batch's activations from every device of the previous stage that holds my samples."""

    op: ClassVar[str] = "recv_activation"


@dataclass(frozen=True)
class Forward(Instruction):
    """The stage's forward pass; on the last stage also the loss, scaled by 1 / mini-batch."""

    op: ClassVar[str] = "forward"


@dataclass(frozen=True)
class SendActivation(Instruction):
    """Send each device of the next stage the activations of the samples it holds."""

    op: ClassVar[str] = "send_activation"


@dataclass(frozen=True)
class SendOutput(Instruction):
    """Inference, last stage: return the micro-batch's outputs (the logits) to the portal."""

    op: ClassVar[str] = "send_output"


@dataclass(frozen=True)
class RecvGrad(Instruction):
    """Receive the gradient of the micro-batch's output from the next stage's devices."""

    op: ClassVar[str] = "recv_grad"


@dataclass(frozen=True)
class Backward(Instruction):
    """The stage's backward pass; gradients accumulate until the flush."""

    op: ClassVar[str] = "backward"


@dataclass(frozen=True)
class SendGrad(Instruction):
    """Send each device of the previous stage the input gradient of its samples."""

    op: ClassVar[str] = "send_grad"


@dataclass(frozen=True)
class ReduceGrads(Instruction):
    """Sum gradients (and share-weighted float buffers) over the replicas of a replicated stage."""

    op: ClassVar[str] = "reduce_grads"


@dataclass(frozen=True)
class OptimizerStep(Instruction):
    """The flush's step: FedProx term, then one optimizer step for the whole mini-batch.

    In an asynchronous program (``micro_batch`` >= 0) the step right after
    that micro-batch's backward, with the gradient it computed on the
    weights its forward used (PipeDream's weight stashing).
    """

    op: ClassVar[str] = "optimizer_step"


@dataclass(frozen=True)
class AggregateWeights(Instruction):
    """FTPipeHD §III-C: the stage's weights become the mean of its last S - s versions (asynchronous programs)."""

    op: ClassVar[str] = "aggregate_weights"


Program = tuple[Instruction, ...]

INSTRUCTIONS: dict[str, type[Instruction]] = {
    cls.op: cls for cls in (LoadMicroBatch, RecvActivation, Forward, SendActivation, SendOutput, RecvGrad, Backward,
                            SendGrad, ReduceGrads, OptimizerStep, AggregateWeights)
}


def device_program(actions: Sequence[Action], stage: int, num_stages: int, replicated: bool) -> Program:
    """The program of one device of ``stage`` running its stage's ``actions``, then the flush."""
    first, last = stage == 0, stage == num_stages - 1
    program: list[Instruction] = []
    for action in actions:
        m = action.micro_batch
        if action.kind == ActionKind.FORWARD:
            program += [LoadMicroBatch(m) if first else RecvActivation(m), Forward(m)]
            program += [] if last else [SendActivation(m)]
        elif action.kind == ActionKind.BACKWARD:
            program += ([] if last else [RecvGrad(m)]) + [Backward(m)] + ([] if first else [SendGrad(m)])
        else:
            raise ScheduleError(f"unknown action kind {action.kind!r} in {action}")
    program += ([ReduceGrads()] if replicated else []) + [OptimizerStep()]
    return tuple(program)


def async_program(actions: Sequence[Action], stage: int, num_stages: int, aggregate_every: int) -> Program:
    """An asynchronous 1F1B device program (FTPipeHD §III-C): every backward is followed by its own
    optimizer step, and every ``aggregate_every`` x (S - s) steps by a weight aggregation (stages that run
    S - s > 1 weight versions at once; 0: never)."""
    first, last = stage == 0, stage == num_stages - 1
    versions = num_stages - stage
    program: list[Instruction] = []
    steps = 0
    for action in actions:
        m = action.micro_batch
        if action.kind == ActionKind.FORWARD:
            program += [LoadMicroBatch(m) if first else RecvActivation(m), Forward(m)]
            program += [] if last else [SendActivation(m)]
        elif action.kind == ActionKind.BACKWARD:
            program += ([] if last else [RecvGrad(m)]) + [Backward(m)] + ([] if first else [SendGrad(m)])
            program.append(OptimizerStep(m))
            steps += 1
            if aggregate_every and versions > 1 and steps % (aggregate_every * versions) == 0:
                program.append(AggregateWeights(m))
        else:
            raise ScheduleError(f"unknown action kind {action.kind!r} in {action}")
    return tuple(program)


def program_from_json(data: Sequence[dict]) -> Program:
    """A program from its JSON form; an unknown instruction is a :class:`ScheduleError`."""
    program = []
    for item in data:
        cls = INSTRUCTIONS.get(item.get("op")) if isinstance(item, dict) else None
        if cls is None:
            raise ScheduleError(f"unknown instruction {item!r}; valid: {', '.join(INSTRUCTIONS)}")
        program.append(cls(int(item.get("micro_batch", -1))))
    return tuple(program)


def check_program(program: Program, stage: int, num_stages: int, replicated: bool,
                  asynchronous: bool = False) -> None:
    """Raise :class:`ScheduleError` unless ``program`` is a well-formed sync-round of a device of ``stage``
    (or, ``asynchronous``, a well-formed asynchronous 1F1B program: a step after every backward, no flush)."""
    first, last = stage == 0, stage == num_stages - 1
    needs = {  # instruction -> the instruction on the same micro-batch that must come before it
        Forward: LoadMicroBatch if first else RecvActivation,
        SendActivation: Forward,
        Backward: Forward if last else RecvGrad,
        RecvGrad: Forward,
        SendGrad: Backward,
    }
    if asynchronous:
        needs.update({OptimizerStep: Backward, AggregateWeights: OptimizerStep})
    misplaced = {LoadMicroBatch: not first, RecvActivation: first, SendActivation: last, RecvGrad: last,
                 SendGrad: first, ReduceGrads: asynchronous or not replicated,
                 AggregateWeights: not asynchronous or num_stages - stage < 2, SendOutput: True}
    done: set[tuple[type, int]] = set()
    for i, ins in enumerate(program):
        kind = type(ins)
        where = f"instruction {i} ({ins.op} {ins.micro_batch}) of stage {stage}"
        if misplaced.get(kind, False):
            raise ScheduleError(f"{where}: not an instruction of this stage")
        if (kind, ins.micro_batch) in done:
            raise ScheduleError(f"{where}: repeated")
        if kind in needs and (needs[kind], ins.micro_batch) not in done:
            raise ScheduleError(f"{where}: comes before its {needs[kind].op}")
        if not asynchronous and kind in (ReduceGrads, OptimizerStep) and \
                i < len(program) - (2 if kind is ReduceGrads else 1):
            raise ScheduleError(f"{where}: the flush must come last")
        done.add((kind, ins.micro_batch))
    obligations = [(Forward, Backward)] + ([] if last else [(Forward, SendActivation)]) + (
        [] if first else [(Backward, SendGrad)]) + ([(Backward, OptimizerStep)] if asynchronous else [])
    for made, then in obligations:
        missing = sorted(m for kind, m in done if kind is made and (then, m) not in done)
        if missing:
            raise ScheduleError(f"stage {stage}: micro-batches {missing} have a {made.op} but no {then.op}")
    if not asynchronous and (not program or not isinstance(program[-1], OptimizerStep)):
        raise ScheduleError(f"stage {stage}: the program must end with the optimizer step")


def stream_program(stage: int, num_stages: int, num_micro_batches: int) -> Program:
    """Inference (PipeEdge): each micro-batch in, forward, out; no backward, no flush.

    Stage 0 loads from the portal, the others receive from the previous
    stage; the last stage returns its outputs to the portal, the others send
    them on. Micro-batches follow each other with nothing in between: how
    many a device holds at once is bounded by back-pressure on its links, not
    by the program.
    """
    if num_micro_batches < 1:
        raise ScheduleError(f"a stream needs at least one micro-batch, got {num_micro_batches}")
    first, last = stage == 0, stage == num_stages - 1
    program: list[Instruction] = []
    for m in range(num_micro_batches):
        program += [LoadMicroBatch(m) if first else RecvActivation(m), Forward(m),
                    SendOutput(m) if last else SendActivation(m)]
    return tuple(program)

