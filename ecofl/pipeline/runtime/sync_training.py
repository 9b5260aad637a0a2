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

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ecofl.net.wire import send_message
from ecofl.pipeline.plan import ScheduleKind
from ecofl.pipeline.runtime.errors import DevicesLost
from ecofl.pipeline.runtime.recovery import Recovery
from ecofl.pipeline.runtime.statistics import PipelineResult, pipeline_result
from ecofl.weights import Weights

if TYPE_CHECKING:
    from ecofl.pipeline.runtime.portal import HomePipeline


def set_up_stages(p: "HomePipeline", start_weights, ref, optimization) -> None:
    """Every stage gets its starting weights, its FedProx reference and a fresh optimizer."""
    for role in p.roles:
        keys = p.stage_keys[role.stage]
        arrays = {k: np.asarray(start_weights[k]) for k in keys}
        if optimization["mu"] > 0:
            arrays.update({f"reference/{k}": np.asarray(ref[k]) for k in keys if k in p.parameter_keys})
        header = {"type": "setup", "optimization": optimization}
        try:
            send_message(p.connections[role.device], header, arrays)
        except OSError:
            raise p.failure(role.device, None, "setting up the stages") from None
    p.gather("ok")


def collect_weights(p: "HomePipeline") -> Weights:
    """The trained model, stage by stage, in state_dict order."""
    for role in p.roles:
        send_message(p.connections[role.device], {"type": "collect"})
    collected: dict[str, np.ndarray] = {}
    for reply in p.gather("weights", with_arrays=True).values():
        collected.update(reply["arrays"])
    p.weights = [collected[k] for k in p.keys]
    return p.weights


def train_async(p: "HomePipeline", start_weights, ref, x, y, sync_rounds, optimization) -> PipelineResult:
    """Asynchronous 1F1B: the call's sync_rounds x M micro-batches as one pass (see :meth:`HomePipeline.train`)."""
    set_up_stages(p, start_weights, ref, optimization)
    count = sync_rounds * p.plan.num_micro_batches
    origin = time.time()
    send_round(p, 0, x.detach().cpu().numpy(), y.detach().cpu().numpy(), {}, count)
    replies = p.gather("done")
    elapsed = time.time() - origin
    stage_of = {role.device: role.stage for role in p.roles}
    rounds = [{d: {**reply, "stage": stage_of[d]} for d, reply in replies.items()}]
    return pipeline_result(collect_weights(p), count * p.plan.micro_batch, len(p.plan.stages), rounds,
                           [elapsed], origin)


def train_sync_rounds(p: "HomePipeline", start_weights, ref, x, y, sync_rounds, optimization, progress,
                      inject) -> PipelineResult:
    """Sync-rounds 0 .. sync_rounds - 1, then the weights; a device lost at any moment of it (setting up, a
    round, replication, the global copy, a re-plan, collecting) is recovered from, and the rounds since the
    version restored are replayed."""
    mu = optimization["mu"]
    recovery = Recovery(p, ref if mu > 0 else {}, inject, optimization)
    recovery.global_copy = (0, {k: np.asarray(v) for k, v in start_weights.items()})  # the portal has version 0
    try:
        set_up_stages(p, start_weights, ref, optimization)
    except DevicesLost as lost:
        recovery.recover(lost, 0)
    x_np, y_np = x.detach().cpu().numpy(), y.detach().cpu().numpy()
    rounds: dict[int, dict[int, dict[str, Any]]] = {}
    round_s: dict[int, float] = {}
    epochs: dict[int, int] = {}  # sync-round -> the pipeline epoch it ran in
    origin = time.time()
    r = 0
    while True:
        try:
            if r == sync_rounds:
                collect_weights(p)
                break
            recovery.before_round(r)
            started = time.time()
            send_round(p, r, x_np, y_np, recovery.slowdowns, p.plan.num_micro_batches,
                             recovery.kept_versions(r))
            recovery.after_send(r)
            replies = p.gather("done")
            stage_of = {role.device: role.stage for role in p.roles}
            rounds[r] = {d: {**reply, "stage": stage_of[d]} for d, reply in replies.items()}
            round_s[r] = time.time() - started
            epochs[r] = recovery.epoch
            r += 1
            recovery.after_round(r - 1, replies, round_s[r - 1])
            if progress is not None:
                progress(r - 1, round_s[r - 1])
        except DevicesLost as lost:
            r = recovery.recover(lost, r)
    ordered = sorted(rounds)
    return pipeline_result(
        p.weights, p.plan.batch_size, len(p.plan.stages), [rounds[i] for i in ordered],
        [round_s[i] for i in ordered], origin, tuple(e.to_dict() for e in recovery.finish(round_s)),
        recovery.lost_rounds, tuple(epochs[i] for i in ordered),
    )


def send_round(p: "HomePipeline", r: int, x_np: np.ndarray, y_np: np.ndarray, slowdowns: dict[int, float],
                m_count: int, keep: Sequence[int] = ()) -> None:
    """Sync-round r's ``m_count`` micro-batches: inputs to stage 0, labels to the last stage (an asynchronous
    pass: all of the call's micro-batches, each its own update). ``keep``: the committed versions besides r
    the workers keep copies of."""
    plan = p.plan
    micro = plan.micro_batch
    index = (r * plan.batch_size + np.arange(m_count * micro)) % len(x_np)
    xb = x_np[index].reshape(m_count, micro, *x_np.shape[1:])
    yb = y_np[index].reshape(m_count, micro)
    asynchronous = plan.schedule == ScheduleKind.ASYNC_ONE_F_ONE_B
    last = len(plan.stages) - 1
    for role in p.roles:
        arrays = {}
        if role.stage == 0:
            arrays["inputs"] = xb[:, role.lo : role.hi]
        if role.stage == last:
            arrays["labels"] = yb[:, role.lo : role.hi]
        header = {"type": "round", "batch_size": micro if asynchronous else plan.batch_size, "version": r,
                  "slowdown": slowdowns.get(role.device, 1.0), "num_micro_batches": m_count, "keep": list(keep)}
        try:
            send_message(p.connections[role.device], header, arrays)
        except OSError:
            raise p.failure(role.device, None, f"sending sync-round {r}") from None
