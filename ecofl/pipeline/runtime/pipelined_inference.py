"""Pipelined inference over a home's devices (PipeEdge): weights into every stage, micro-batches streamed.

The same workers and links as training, without backward or flush: the
inputs are split into micro-batches of the plan's size (the last one padded
by repeating its last sample; the padding's outputs are dropped) and stream
through the stages, back-pressured (:mod:`.stream_stage`); the last stage
returns the logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ecofl.net.wire import send_message
from ecofl.pipeline.runtime.statistics import InferenceResult, inference_result

if TYPE_CHECKING:
    from ecofl.pipeline.runtime.portal import HomePipeline


def stream_inference(p: "HomePipeline", x: torch.Tensor) -> InferenceResult:
    """The logits of every sample of ``x`` with the pipeline's current weights (loaded into every stage first)."""
    state = dict(zip(p.keys, p.weights))
    for role in p.roles:
        arrays = {k: np.asarray(state[k]) for k in p.stage_keys[role.stage]}
        send_message(p.connections[role.device], {"type": "weights"}, arrays)
    p.gather("loaded")
    b = p.plan.micro_batch
    count = -(-len(x) // b)
    x_np = x.detach().cpu().numpy()
    index = np.minimum(np.arange(count * b), len(x_np) - 1)
    xb = x_np[index].reshape(count, b, *x_np.shape[1:])
    for role in p.roles:
        arrays = {"inputs": xb[:, role.lo : role.hi]} if role.stage == 0 else {}
        send_message(p.connections[role.device], {"type": "infer", "num_micro_batches": count}, arrays)
    replies = p.gather("inferred", with_arrays=True)
    last = len(p.plan.stages) - 1
    logits = None
    for role in p.roles:
        replies[role.device]["stage"] = role.stage
        if role.stage == last and role.samples:
            outputs = replies[role.device]["arrays"]["outputs"]  # [count, samples of mine, ...]
            if logits is None:
                logits = np.empty((count, b, *outputs.shape[2:]), dtype=outputs.dtype)
            logits[:, role.lo : role.hi] = outputs
    logits = logits.reshape(count * b, *logits.shape[2:])[: len(x)]
    return inference_result(logits, b, count, len(p.plan.stages), replies)
