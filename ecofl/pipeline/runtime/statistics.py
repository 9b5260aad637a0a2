"""What a home pipeline measured, reduced per stage (the portal's statistics).

:func:`pipeline_result` folds the workers' per-round reports of training
(their timeline events, resident forwards, memory) into a
:class:`PipelineResult`; :func:`inference_result` folds one inference
stream's into an :class:`InferenceResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ecofl.pipeline.schedule import PASSES, ActionKind
from ecofl.pipeline.timeline import TimelineEvent
from ecofl.weights import Weights


@dataclass(frozen=True)
class PipelineResult:
    """What :meth:`HomePipeline.train` measured; per-stage tuples are indexed by stage."""

    weights: Weights  # state_dict order, like ecofl.weights.get_weights
    loss: float  # mean training loss over every sample of every sync-round (no proximal term)
    batch_size: int
    sync_round_s: tuple[float, ...]  # measured at the portal, one per sync-round
    forward_s: tuple[float, ...]  # mean seconds of one micro-batch's forward (slowest device of the stage)
    backward_s: tuple[float, ...]
    busy_fraction: tuple[float, ...]  # compute time / sync-round time (busiest device, mean over rounds)
    # measured: CPU seconds a sync-round of the stage's busiest worker process, every thread (None: not reported)
    cpu_s: tuple[float | None, ...]
    # measured: the same worker's CPU seconds a sync-round by what its threads do (:mod:`.thread_cpu`; {}: none)
    cpu_s_by_job: tuple[dict[str, float], ...]
    # measured: that worker's stage thread's CPU seconds a sync-round in its forwards and backwards (None: not reported)
    pass_cpu_s: tuple[float | None, ...]
    peak_resident: tuple[int, ...]  # most micro-batches whose activations a device held at once
    peak_activation_bytes: tuple[int, ...]
    peak_memory_bytes: tuple[int, ...]  # accounted: weights + gradients + optimizer state + peak activations
    peak_rss_bytes: tuple[int | None, ...]  # measured: the worker process's peak resident set in a sync-round
    peak_accelerator_bytes: tuple[int | None, ...]  # measured: torch's peak on the stage's GPUs (None: CPUs)
    training_rss_bytes: tuple[int | None, ...]  # measured: that peak above the process before any model was built
    timeline: tuple[TimelineEvent, ...]  # seconds since the first sync-round began
    events: tuple[dict, ...] = ()  # injected or detected failures, slow-downs and joins, and their recovery
    lost_rounds: int = 0  # sync-rounds computed again after recoveries (restored from an older version)
    round_epochs: tuple[int, ...] = ()  # the pipeline epoch (plan) each sync-round ran in; () : one plan throughout
    # asynchronous 1F1B, per device: (micro-batch, the weight version its forward and backward used,
    # the stage's version at its backward): the staleness of every update
    weight_versions: dict[int, tuple[tuple[int, int, int], ...]] = field(default_factory=dict)
    # the re-tunes on the pipeline's own speeds, in order (TuningDecision.to_dict, with seconds and bytes moved)
    tunings: tuple[dict, ...] = ()
    # measured, per sync-round: the bytes each reporting device's process touched for the first time (a stage's
    # first round maps its stash, docs/pipeline.md)
    first_touched_by_device: tuple[dict[int, int], ...] = ()

    @property
    def throughput(self) -> float:
        """Samples per second over all sync-rounds."""
        return self.batch_size * len(self.sync_round_s) / sum(self.sync_round_s)

    @property
    def first_touched_bytes(self) -> tuple[int | None, ...]:
        """Per sync-round, the most bytes one device's process touched for the first time (None: none reported)."""
        return tuple(max(touched.values(), default=None) for touched in self.first_touched_by_device)

    @property
    def final_plan_round_s(self) -> tuple[float, ...]:
        """The sync-rounds run by the final plan (after the last re-plan): what its prediction is for."""
        if not self.round_epochs:
            return self.sync_round_s
        last = self.round_epochs[-1]
        return tuple(s for s, epoch in zip(self.sync_round_s, self.round_epochs) if epoch == last)

    @property
    def rounds_completed(self) -> int:
        return len(self.sync_round_s)


def _mean_by_job(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each job's mean CPU seconds over the rounds (a round where a job's thread did not run counts 0)."""
    jobs = sorted({job for by_job in rounds for job in by_job})
    return {job: round(sum(by_job.get(job, 0.0) for by_job in rounds) / len(rounds), 4) for job in jobs}


def pipeline_result(
    weights: Weights, batch_size: int, num_stages: int, rounds: list[dict[int, dict[str, Any]]],
    round_s: list[float], origin: float, events: tuple[dict, ...] = (), lost_rounds: int = 0,
    round_epochs: tuple[int, ...] = (), tunings: Sequence[dict] = (),
) -> PipelineResult:
    """Reduce per-round worker reports (``rounds[r][device]``, each with its ``stage``) into a result.

    Per-stage figures are those of the final plan's ``num_stages`` stages (a
    re-planned pipeline reports its devices under the stage they served in
    each round); the timeline has every device's events, under the stage it
    served in then.
    """
    fwd = [[] for _ in range(num_stages)]
    bwd = [[] for _ in range(num_stages)]
    busy = [[0.0] * len(rounds) for _ in range(num_stages)]
    cpu: list[dict[int, float]] = [{} for _ in range(num_stages)]  # round -> its busiest worker's CPU seconds
    cpu_jobs: list[dict[int, dict[str, float]]] = [{} for _ in range(num_stages)]  # round -> that worker's by job
    cpu_passes: list[dict[int, float | None]] = [{} for _ in range(num_stages)]  # round -> that worker's in passes
    resident, act, memory = [0] * num_stages, [0] * num_stages, [0] * num_stages
    rss: list[int | None] = [None] * num_stages
    training_rss: list[int | None] = [None] * num_stages
    gpu: list[int | None] = [None] * num_stages
    timeline, loss = [], 0.0
    per_device_f: dict[int, list[float]] = {}
    per_device_b: dict[int, list[float]] = {}
    stage_of: dict[int, int] = {}
    versions: dict[int, list[tuple[int, int, int]]] = {}
    for r, replies in enumerate(rounds):
        for device, reply in replies.items():
            s = reply["stage"]
            loss += reply["loss_sum"]
            timeline += [TimelineEvent(device, s, kind, m, start - origin, end - origin)
                         for kind, m, start, end in _events(reply)]  # every device's, whichever plan
            if s >= num_stages:
                continue
            stage_of[device] = s
            versions.setdefault(device, []).extend(tuple(v) for v in reply.get("weight_versions", ()))
            compute = 0.0
            for kind, m, start, end in _events(reply):
                if kind in PASSES:
                    compute += end - start
                    per_device = per_device_f if kind == ActionKind.FORWARD else per_device_b
                    per_device.setdefault(device, []).append(end - start)
            busy[s][r] = max(busy[s][r], compute / round_s[r])
            if reply.get("cpu_s") is not None and reply["cpu_s"] >= cpu[s].get(r, 0.0):
                cpu[s][r], cpu_jobs[s][r] = reply["cpu_s"], reply.get("cpu_s_by_job") or {}
                cpu_passes[s][r] = reply.get("pass_cpu_s")
            resident[s] = max(resident[s], reply["peak_resident"])
            act[s] = max(act[s], reply["peak_activation_bytes"])
            memory[s] = max(memory[s], reply["fixed_bytes"] + reply["peak_activation_bytes"])
            _fold_rss(rss, training_rss, s, reply)
            if reply.get("peak_accelerator_bytes") is not None:
                gpu[s] = max(gpu[s] or 0, reply["peak_accelerator_bytes"])
    for device, times in per_device_f.items():
        fwd[stage_of[device]].append(float(np.mean(times)))
    for device, times in per_device_b.items():
        bwd[stage_of[device]].append(float(np.mean(times)))
    return PipelineResult(
        weights=weights,
        loss=loss / (batch_size * len(rounds)),
        batch_size=batch_size,
        sync_round_s=tuple(round_s),
        forward_s=tuple(max(t, default=0.0) for t in fwd),
        backward_s=tuple(max(t, default=0.0) for t in bwd),
        busy_fraction=tuple(float(np.mean(b)) for b in busy),
        cpu_s=tuple(float(np.mean(list(c.values()))) if c else None for c in cpu),
        cpu_s_by_job=tuple(_mean_by_job(list(jobs.values())) for jobs in cpu_jobs),
        pass_cpu_s=tuple(_mean_reported(list(c.values())) for c in cpu_passes),
        peak_resident=tuple(resident),
        peak_activation_bytes=tuple(act),
        peak_memory_bytes=tuple(memory),
        peak_rss_bytes=tuple(rss),
        peak_accelerator_bytes=tuple(gpu),
        training_rss_bytes=tuple(training_rss),
        timeline=tuple(sorted(timeline, key=lambda e: (e.start, e.device))),
        events=events,
        lost_rounds=lost_rounds,
        round_epochs=tuple(round_epochs),
        weight_versions={d: tuple(v) for d, v in versions.items() if v},
        tunings=tuple(tunings),
        first_touched_by_device=tuple({d: reply["first_touched_bytes"] for d, reply in replies.items()
                                       if reply.get("first_touched_bytes") is not None} for replies in rounds),
    )


def _mean_reported(values: list[float | None]) -> float | None:
    """The mean of the values reported (None: none was)."""
    reported = [v for v in values if v is not None]
    return float(np.mean(reported)) if reported else None


@dataclass(frozen=True)
class InferenceResult:
    """What :meth:`HomePipeline.infer` measured; figures defined as the stream cost model defines them
    (:func:`ecofl.pipeline.stream.simulate_stream`) so the two compare directly."""

    logits: np.ndarray  # [samples, classes], in the order of the inputs
    micro_batch: int
    num_micro_batches: int
    stream_s: float  # the first input leaves the portal -> the last result is back at the portal
    stream_throughput: float  # samples/s over the whole stream, fill and drain included
    throughput: float  # samples/s in the steady state: micro_batch / period_s
    period_s: float  # steady-state interval between results (over the stream's second half)
    latency_s: float  # steady state: mean seconds from a micro-batch leaving the portal to its result there
    first_latency_s: float  # the same for the first micro-batch, through an empty pipeline
    forward_s: tuple[float, ...]  # mean forward of a micro-batch on each stage's slowest device
    busy_fraction: tuple[float, ...]  # steady state: forward_s / period_s
    peak_held: tuple[int, ...]  # most micro-batches a device of the stage held at once
    peak_rss_bytes: tuple[int | None, ...]  # measured peak resident set of the stage's workers
    training_rss_bytes: tuple[int | None, ...]  # that peak above the process before any model was built
    timeline: tuple[TimelineEvent, ...]  # seconds since the first input left the portal


def inference_result(logits: np.ndarray, micro_batch: int, count: int, num_stages: int,
                     replies: dict[int, dict[str, Any]]) -> InferenceResult:
    """Reduce the workers' ``inferred`` replies (each with its ``stage``) of one stream of ``count`` micro-batches."""
    admitted, done = [np.inf] * count, [0.0] * count
    forward: list[list[float]] = [[] for _ in range(num_stages)]
    held, rss, training = [0] * num_stages, [None] * num_stages, [None] * num_stages
    for device, reply in replies.items():
        s = reply["stage"]
        per_device: list[float] = []
        for kind, m, start, end in _events(reply):
            if kind == ActionKind.RECV and s == 0:
                admitted[m] = min(admitted[m], start)
            elif kind == ActionKind.OUTPUT:
                done[m] = max(done[m], end)
            elif kind == ActionKind.FORWARD:
                per_device.append(end - start)
        if per_device:
            forward[s].append(float(np.mean(per_device)))
        held[s] = max(held[s], reply["peak_held"])
        _fold_rss(rss, training, s, reply)
    origin = min(admitted)
    half = count // 2
    stream_s = done[-1] - origin
    period = (done[-1] - done[half - 1]) / (count - half) if count > 1 else stream_s
    stage_forward = tuple(max(f, default=0.0) for f in forward)
    timeline = [TimelineEvent(device, reply["stage"], kind, m, start - origin, end - origin)
                for device, reply in replies.items() for kind, m, start, end in _events(reply)]
    return InferenceResult(
        logits=logits, micro_batch=micro_batch, num_micro_batches=count,
        stream_s=stream_s,
        stream_throughput=count * micro_batch / stream_s if stream_s > 0 else float("inf"),
        throughput=micro_batch / period if period > 0 else float("inf"),
        period_s=period,
        latency_s=float(np.mean([done[m] - admitted[m] for m in range(half, count)])),
        first_latency_s=done[0] - admitted[0],
        forward_s=stage_forward,
        busy_fraction=tuple(min(1.0, f / period) if period > 0 else 0.0 for f in stage_forward),
        peak_held=tuple(held), peak_rss_bytes=tuple(rss), training_rss_bytes=tuple(training),
        timeline=tuple(sorted(timeline, key=lambda e: (e.start, e.device))),
    )


def _events(reply: dict[str, Any]) -> list[tuple[ActionKind, int, float, float]]:
    """A worker's measured ``(kind, micro-batch, start, end)`` events, each kind parsed from its string form."""
    return [(ActionKind.from_str(kind), m, start, end) for kind, m, start, end in reply["events"]]


def _fold_rss(peak: list[int | None], training: list[int | None], stage: int, reply: dict[str, Any]) -> None:
    """Keep the stage's largest measured peak resident set, and that peak above the bare process."""
    measured, baseline = reply.get("peak_rss_bytes"), reply.get("baseline_rss_bytes")
    if measured is not None:
        peak[stage] = max(peak[stage] or 0, measured)
        if baseline is not None:
            training[stage] = max(training[stage] or 0, measured - baseline)
