"""Pipelined inference over a home's devices (PipeEdge): weights into every stage, micro-batches streamed.

The same workers and links as training, without backward or flush: the
inputs are split into micro-batches of the plan's size (the last one padded
by repeating its last sample; the padding's outputs are dropped) and stream
through the stages, back-pressured (:mod:`.stream_stage`); the last stage
returns the logits.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ecofl.accelerator import host_array
from ecofl.pipeline.runtime.control_messages import Infer, Inferred, Load, Loaded
from ecofl.pipeline.runtime.control_plane import ControlPlane
from ecofl.pipeline.runtime.layout import PipelineLayout
from ecofl.pipeline.runtime.statistics import InferenceResult, inference_result
from ecofl.weights import Weights


def stream_inference(control: ControlPlane, layout: PipelineLayout, weights: Weights,
                     x: torch.Tensor) -> InferenceResult:
    """The logits of every sample of ``x`` with ``weights`` (loaded into every stage first)."""
    state = dict(zip(layout.keys, weights))
    for role in layout.roles:
        control.send(role.device, Load(), {k: np.asarray(state[k]) for k in layout.stage_keys[role.stage]})
    control.gather(Loaded)
    plan = layout.plan
    b = plan.micro_batch
    count = -(-len(x) // b)
    x_np = host_array(x)
    index = np.minimum(np.arange(count * b), len(x_np) - 1)
    xb = x_np[index].reshape(count, b, *x_np.shape[1:])
    for role in layout.roles:
        arrays = {"inputs": xb[:, role.lo : role.hi]} if role.stage == 0 else {}
        control.send(role.device, Infer(count), arrays)
    replies = control.gather_with_arrays(Inferred)
    last = len(plan.stages) - 1
    logits = None
    for role in layout.roles:
        if role.stage == last and role.samples:
            outputs = replies[role.device][1]["outputs"]  # [count, samples of mine, ...]
            if logits is None:
                logits = np.empty((count, b, *outputs.shape[2:]), dtype=outputs.dtype)
            logits[:, role.lo : role.hi] = outputs
    logits = logits.reshape(count * b, *logits.shape[2:])[: len(x)]
    reports = {role.device: {**dataclasses.asdict(replies[role.device][0]), "stage": role.stage}
               for role in layout.roles}
    return inference_result(logits, b, count, len(plan.stages), reports)
