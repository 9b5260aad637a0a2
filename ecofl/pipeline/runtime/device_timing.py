"""What a calibrating device runs in its cgroup (``python -m ecofl.pipeline.runtime.device_timing``).

:func:`~.calibration.measure_speeds` starts one such process per confined
device (and per device training on a GPU, ``--accelerator``, where its stage
lives as in its worker: :mod:`.accelerator_devices`). It imports torch,
builds the model and computes its stage's input at the start-up quota; runs
its first steps (which map the stage's memory) and measures the CPU each byte
it maps anew costs on a fresh mapping of its own
(:func:`~.process_memory.first_touch_cpu_s_per_byte`; docs/pipeline.md, "A
new stage's first round"); says ``ready``; and once the
portal has put it under its own quota and said ``go``, times its steps at
its pace, each pass followed by the hand-offs its stage makes after it
(:mod:`.link_work`), for at least ``--seconds`` and then until it knows its
mean step to ``--precision`` (at most ``--max-seconds``). On a GPU each pass
is timed after its kernels (:func:`ecofl.accelerator.finish`), and what it
hands off leaves the GPU through :func:`ecofl.accelerator.host_copy`, as a
worker's does.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch

from ecofl.accelerator import finish, host_copy, resolve_device
from ecofl.allocator import keep_freed_memory
from ecofl.net.links import never_aborted
from ecofl.pipeline.runtime.confinement import worker_threads
from ecofl.pipeline.runtime.cpu_pace import CpuPace
from ecofl.pipeline.runtime.emulation import saved_bytes
from ecofl.pipeline.runtime.heap import freeze_heap
from ecofl.pipeline.runtime.layer_abort import abort_between_layers
from ecofl.pipeline.runtime.link_work import LoopbackLinks, hand_offs_per_pass
from ecofl.pipeline.runtime.model_spec import spec_from_json
from ecofl.pipeline.runtime.pipe_messages import CALIBRATION_REQUESTS, Timed, read_line, write_line
from ecofl.pipeline.runtime.process_memory import first_touch_cpu_s_per_byte

OBJECTIVES = ("training", "inference")  # what a device times: the steps it will run
#: Seconds of timed steps per device, at least. Asteroid Env B's five devices at 4 samples, calibrated 6 times
#: each: 2 s varied by 4.5-7.4% (coefficient of variation; up to 1.24x between two runs), 6 s by 2.0-6.2%.
CALIBRATION_S = 5.0
#: A device keeps timing past its minimum until its mean step is known to within this (its relative standard
#: error, :func:`relative_error`), or until CALIBRATION_EXTENSION times its minimum. A throttled device's steps
#: come in whole CFS periods: the mixed home's Raspberry Pi (0.025 cores, a 40 ms period) timed 27 steps in 5 s
#: whose seconds varied by 19% (2026-12-04 18:15), so its 5-second mean was known to about 4%, the Nanos' to
#: under 1%.
CALIBRATION_PRECISION = 0.02
CALIBRATION_EXTENSION = 4.0
#: Consecutive batches of steps whose means :func:`relative_error` compares.
ERROR_BATCHES = 10
#: Seconds of steps between two checks of the error past the minimum.
CHECK_EVERY_S = 0.25


def relative_error(durations: Sequence[float], batches: int = ERROR_BATCHES) -> float:
    """The standard error of the mean of ``durations`` over that mean, from the means of ``batches`` equal batches
    of consecutive steps (the method of batch means: a device whose speed drifts over seconds times steps that
    are not independent, and the batches' means carry the drift); inf with fewer than two steps a batch."""
    size = len(durations) // batches
    if size < 2:
        return math.inf
    means = [statistics.fmean(durations[b * size:(b + 1) * size]) for b in range(batches)]
    return statistics.stdev(means) / math.sqrt(batches) / statistics.fmean(means)


def seconds_per_call(step: Callable[[], object], min_seconds: float, min_calls: int = 3) -> float:
    """Mean seconds of ``step`` over at least ``min_calls`` calls lasting at least ``min_seconds`` in all."""
    return timed_calls(step, min_seconds, min_calls)[0]


def timed_calls(step: Callable[[], object], min_seconds: float, min_calls: int = 3, precision: float = math.inf,
                max_seconds: float = math.inf) -> tuple[float, float, float]:
    """Mean seconds and mean CPU seconds of this process (all its threads) of ``step``, and the mean's
    :func:`relative_error`: over at least ``min_calls`` calls lasting at least ``min_seconds`` in all, and then
    on until that error is at most ``precision`` or the calls have lasted ``max_seconds``.

    Each call is timed alone, and the error is checked between calls every :data:`CHECK_EVERY_S` of them, its
    CPU left out: the check, whose cost grows with the calls, does not slow the steps it measures."""
    durations: list[float] = []
    stepped, next_check, checking_cpu_s = 0.0, min_seconds, 0.0
    cpu = time.process_time()

    def more() -> bool:
        nonlocal next_check, checking_cpu_s
        if len(durations) < min_calls or stepped < min_seconds:
            return True
        if stepped >= max_seconds:
            return False
        if stepped < next_check:
            return True
        before = time.process_time()
        known = relative_error(durations) <= precision
        checking_cpu_s += time.process_time() - before
        next_check = stepped + CHECK_EVERY_S
        return not known

    while more():
        begin = time.perf_counter()
        step()
        durations.append(time.perf_counter() - begin)
        stepped += durations[-1]
    calls = len(durations)
    return stepped / calls, (time.process_time() - cpu - checking_cpu_s) / calls, relative_error(durations)


def main() -> int:
    parser = argparse.ArgumentParser(description="time steps of a model here (in a device's cgroup)")
    parser.add_argument("--model", required=True, help="the model as JSON (ModelSpec.to_json)")
    parser.add_argument("--input-shape", required=True, help="one sample's shape, e.g. 1,28,28")
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--layers", default=None, help="first,last layer of the stage to time (default: all)")
    parser.add_argument("--seconds", type=float, default=CALIBRATION_S, help="time steps for at least this long")
    parser.add_argument("--precision", type=float, default=CALIBRATION_PRECISION,
                        help="then on until the mean step's relative standard error is at most this")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help=f"but no longer than this (default: {CALIBRATION_EXTENSION:g} x --seconds)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="training")
    parser.add_argument("--accelerator", default="cpu", help="where the stage trains: cpu, cuda or cuda:N")
    args = parser.parse_args()
    torch.set_num_threads(worker_threads())
    device = resolve_device(args.accelerator, "--accelerator")
    _, layers = spec_from_json(json.loads(args.model)).build()
    first, last = map(int, args.layers.split(",")) if args.layers else (0, len(layers) - 1)
    if not 0 <= first <= last < len(layers):
        parser.error(f"--layers {args.layers}: the model has layers 0-{len(layers) - 1}")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.micro_batch, *map(int, args.input_shape.split(",")), generator=generator)
    with torch.no_grad():  # the stage's input, as the stage before it would send it
        for layer in layers[:first]:
            x = layer(x)
    stage = torch.nn.Sequential(*layers[first : last + 1]).to(device)
    x = x.to(device)
    freeze_heap()  # as a worker does: no full collection of torch's objects inside the timed steps
    keep_freed_memory()  # as a worker does: the timed steps allocate as the stage's will (ecofl.allocator)
    with torch.no_grad():  # the output's shape from one sample in eval mode: it maps next to nothing
        shape = (args.micro_batch, *stage.eval()(x[:1]).shape[1:])
    training = args.objective == "training"
    stage.train(training)
    sends_gradient = first > 0 and training  # a stage sends its input's gradient back
    is_last = last == len(layers) - 1
    y = torch.randint(0, shape[1], (args.micro_batch,), generator=generator).to(device) if is_last else None
    gradient = None if is_last else torch.randn(shape, generator=generator).to(device)  # as the next stage sends it

    weights = list(stage.parameters())
    held: list[torch.Tensor] = []  # a forward's output (the loss on the last stage), until its backward

    def forward() -> None:
        stage.zero_grad(set_to_none=True)
        inputs = x.detach().requires_grad_(sends_gradient)  # a new tensor, as a received one is: it gets the hooks
        with saved_bytes(weights):  # as a stage's forward runs: its memory ledger counts what autograd saves
            out = stage(inputs)
        held.append(torch.nn.functional.cross_entropy(out, y) if is_last else out)

    def backward() -> None:
        out = held.pop()
        out.backward() if is_last else out.backward(gradient)

    def infer() -> None:  # as a streaming stage runs (.stream_stage)
        with torch.no_grad():
            stage(x)

    output = torch.zeros(shape, device=device)  # what the links carry on: its size, not its values, is their work
    hand_offs = hand_offs_per_pass(x.detach(), output, first, is_last, args.objective)
    passes = list(zip((forward, backward) if training else (infer,), hand_offs))

    def step(pace: CpuPace) -> None:
        """One micro-batch as the stage runs it in the pipeline: each pass at the device's pace (``pace``), then
        the hand-offs that follow it (:mod:`.link_work`); the links' threads are not paced: the kernel's quota
        holds them."""
        for run_pass, tensors in passes:
            pace.call(run_pass)
            finish(device)
            for tensor in tensors:
                links.hand_off(host_copy(tensor), pace)
        for tensor in links.received():  # a worker's received tensors go to its device before they are used
            tensor.to(device)
        finish(device)

    # with a stage's hooks (.stage: each layer checks for an abort), as its passes run in the pipeline
    with abort_between_layers(stage, never_aborted), LoopbackLinks() as links:
        for _ in range(2):  # at the start-up quota: what the first steps map and set up is not in the timed ones
            step(CpuPace(None))
        first_touch = first_touch_cpu_s_per_byte()
        write_line(sys.stdout, Timed(None, first_touch))  # ready
        read_line(sys.stdin.readline(), CALIBRATION_REQUESTS)  # Go, or MalformedMessage
        pace = CpuPace.of_this_process()  # under its own quota now: each step at the device's pace, as in the pipeline
        max_seconds = CALIBRATION_EXTENSION * args.seconds if args.max_seconds is None else args.max_seconds
        seconds, cpu_s, error = timed_calls(lambda: step(pace), args.seconds, precision=args.precision,
                                            max_seconds=max_seconds)
        known = None if math.isinf(error) else error
        write_line(sys.stdout, Timed(seconds, cpu_s_per_step=cpu_s, relative_error=known))
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # As a worker ends (.worker): not through the interpreter's shutdown, which can stop a link's daemon thread
    # inside torch's C++ code and abort the process ("terminate called without an active exception").
    os._exit(code)
