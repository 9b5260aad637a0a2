"""Driving one ``HomePipeline.train`` call: set up the stages, run the sync-rounds, survive lost devices.

:func:`train_sync_rounds` runs 1F1B-Sync or GPipe sync-rounds (Eco-FL §4.1:
one mini-batch of M micro-batches per sync-round, weights updated once at
the flush) and, with fault tolerance, recovers from a device lost at any
moment (setting up, a round, replication, the global copy, a re-plan,
collecting) and replays the rounds since the version restored
(:mod:`.recovery`). :func:`train_async` streams an asynchronous 1F1B pass
(FTPipeHD §III-C). The portal feeds inputs to the first stage and labels to
the last; no other device sees data.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ecofl.accelerator import host_array
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.runtime.control_messages import (
    Collect, Config, Done, GlobalCopy, Ok, Replicate, Setup, StageWeights, TrainPass,
)
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.errors import DevicesLost
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.tuning_settings import Tuning
from ecofl.pipeline.runtime.recovery import Recovery
from ecofl.pipeline.runtime.stage import Optimization
from ecofl.pipeline.runtime.statistics import PipelineResult, pipeline_result
from ecofl.weights import Weights

State = dict[str, np.ndarray]


def set_up_stages(control: ControlPlane, layout: PipelineLayout, start: State, ref: State,
                  optimization: Optimization) -> None:
    """Every stage gets its starting weights, its FedProx reference and a fresh optimizer."""
    for role in layout.roles:
        keys = layout.stage_keys[role.stage]
        arrays = {k: np.asarray(start[k]) for k in keys}
        if optimization.mu > 0:
            arrays.update({f"reference/{k}": np.asarray(ref[k]) for k in layout.reference_keys(role.stage)})
        control.send(role.device, Setup(optimization), arrays)
    control.gather(Ok)


def collect_weights(control: ControlPlane, layout: PipelineLayout) -> Weights:
    """The trained model, stage by stage (each over its device's link), in state_dict order."""
    for role in layout.roles:
        control.send(role.device, Collect(link_bps=layout.link_rate(role.device)))
    collected: State = {}
    for _, arrays in control.gather_with_arrays(StageWeights).values():
        collected.update(arrays)
    return [collected[k] for k in layout.keys]


def train_async(control: ControlPlane, layout: PipelineLayout, start: State, ref: State, x: torch.Tensor,
                y: torch.Tensor, sync_rounds: int, optimization: Optimization) -> PipelineResult:
    """Asynchronous 1F1B: the call's sync_rounds x M micro-batches as one pass (see :meth:`HomePipeline.train`)."""
    set_up_stages(control, layout, start, ref, optimization)
    plan = layout.plan
    count = sync_rounds * plan.num_micro_batches
    origin = time.time()
    send_round(control, layout, 0, host_array(x), host_array(y), {}, count)
    replies = control.gather(Done)
    elapsed = time.time() - origin
    return pipeline_result(collect_weights(control, layout), count * plan.micro_batch, len(plan.stages),
                           [_reports(layout, replies)], [elapsed], origin)


def train_sync_rounds(control: ControlPlane, layout: PipelineLayout, ft: FaultTolerance | None,
                      config: Callable[[int], Config],
                      start: State, ref: State, x: torch.Tensor, y: torch.Tensor, sync_rounds: int,
                      optimization: Optimization, progress: Callable[[int, float], None] | None,
                      inject: Sequence[Injection], tuning: Tuning | None = None,
                      emulation: Emulation = Emulation.NONE, cache_dir: str | None = None) -> PipelineResult:
    """Sync-rounds 0 .. sync_rounds - 1, then the weights; a device lost at any moment of it (setting up, a
    round, replication, the global copy, a re-plan, collecting) is recovered from, and the rounds since the
    version restored are replayed. ``tuning`` re-tunes the plan on the speeds of its first rounds, and every few
    after where asked (:mod:`.pipeline_tuning`, predicted in ``emulation`` with the runtime's overheads recorded
    in ``cache_dir``)."""
    recovery = Recovery(control, layout, ft, config, start, ref if optimization.mu > 0 else {}, inject, optimization,
                        tuning, emulation, sync_rounds, cache_dir)
    try:
        set_up_stages(control, layout, start, ref, optimization)
        recovery.stages_set_up()
    except DevicesLost as lost:
        recovery.recover(lost, 0)
    x_np, y_np = host_array(x), host_array(y)
    rounds: dict[int, dict[int, dict[str, Any]]] = {}
    round_s: dict[int, float] = {}
    epochs: dict[int, int] = {}  # sync-round -> the pipeline epoch it ran in
    origin = time.time()
    r = 0
    while True:
        try:
            if r == sync_rounds:
                weights = collect_weights(control, layout)
                break
            recovery.before_round(r)
            started = time.time()
            send_round(control, layout, r, x_np, y_np, recovery.slowdowns, layout.plan.num_micro_batches,
                       recovery.kept_versions(r), recovery.replication(r), recovery.uploads(r))
            recovery.after_send(r)
            replies = control.gather(Done)
            rounds[r] = _reports(layout, replies)
            round_s[r] = time.time() - started
            epochs[r] = recovery.epoch
            r += 1
            recovery.after_round(r - 1, replies, round_s[r - 1])
            if progress is not None:
                progress(r - 1, round_s[r - 1])
        except DevicesLost as lost:
            r = recovery.recover(lost, r)
    ordered = sorted(rounds)
    plan = layout.plan
    return pipeline_result(
        weights, plan.batch_size, len(plan.stages), [rounds[i] for i in ordered],
        [round_s[i] for i in ordered], origin, tuple(e.to_dict() for e in recovery.finish()),
        recovery.lost_rounds, tuple(epochs[i] for i in ordered),
        recovery.tuned,
    )


def _reports(layout: PipelineLayout, replies: dict[int, Done]) -> dict[int, dict[str, Any]]:
    """Each device's measurements of a round, with the stage it served in (:func:`.statistics.pipeline_result`)."""
    stage_of = {role.device: role.stage for role in layout.roles}
    return {d: {**dataclasses.asdict(reply), "stage": stage_of[d]} for d, reply in replies.items()}


def send_round(control: ControlPlane, layout: PipelineLayout, r: int, x_np: np.ndarray, y_np: np.ndarray,
               slowdowns: dict[int, float], m_count: int, keep: Sequence[int] = (),
               replication: dict[int, Replicate] | None = None, uploads: dict[int, GlobalCopy] | None = None) -> None:
    """Sync-round r's ``m_count`` micro-batches: inputs to stage 0, labels to the last stage (an asynchronous
    pass: all of the call's micro-batches, each its own update). ``keep``: the committed versions besides r
    the workers keep copies of; ``replication``: each device's replicas to send and keep while it runs;
    ``uploads``: the devices that send their stage for the global copy meanwhile."""
    plan = layout.plan
    micro = plan.micro_batch
    index = (r * plan.batch_size + np.arange(m_count * micro)) % len(x_np)
    xb = x_np[index].reshape(m_count, micro, *x_np.shape[1:])
    yb = y_np[index].reshape(m_count, micro)
    last = len(plan.stages) - 1
    for role in layout.roles:
        arrays = {}
        if role.stage == 0:
            arrays["inputs"] = xb[:, role.lo : role.hi]
        if role.stage == last:
            arrays["labels"] = yb[:, role.lo : role.hi]
        request = TrainPass(version=r, batch_size=mode_of(plan).request_batch_size(plan), num_micro_batches=m_count,
                        slowdown=slowdowns.get(role.device, 1.0), keep=tuple(keep),
                        replicate=(replication or {}).get(role.device), global_copy=(uploads or {}).get(role.device))
        control.send(role.device, request, arrays)
