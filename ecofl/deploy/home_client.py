"""What the home's Flower ClientApp calls: train one task at the home service (an authenticated local channel)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ecofl.accelerator import host_array
from ecofl.deploy.home_status import connect_to_service
from ecofl.deploy.service_messages import TO_CLIENT, ServiceError, Train, Trained
from ecofl.net.schema import encode
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.runtime.errors import HomePipelineError
from ecofl.pipeline.runtime.model_spec import ZooModel
from ecofl.train import TrainConfig
from ecofl.weights import Weights


@dataclass(frozen=True)
class ServiceTraining:
    weights: Weights
    loss: float
    num_samples: int
    metrics: dict
    devices: list[str]


def train_at_home(address: tuple[str, int], secret: bytes, model: ZooModel, weights: Weights, x: torch.Tensor,
                  y: torch.Tensor, config: TrainConfig, timeout_s: float = 900.0) -> ServiceTraining:
    """Train ``weights`` on ``x, y`` through the home service's pipeline; its error is a HomePipelineError."""
    arrays = {f"w{i}": np.asarray(w) for i, w in enumerate(weights)}
    arrays.update(x=host_array(x), y=host_array(y))
    with connect_to_service(address, secret, timeout_s) as sock:
        send_message(sock, encode(Train(model.to_json(), config, len(weights))), arrays)
        header, out = recv_message(sock)
    reply = TO_CLIENT.decode(header)
    if isinstance(reply, ServiceError):
        raise HomePipelineError(f"the home service could not train: {reply.message}")
    if not isinstance(reply, Trained):
        raise HomePipelineError(f"the home service answered {reply.TYPE!r} to a training request")
    return ServiceTraining([out[f"w{i}"] for i in range(reply.num_weights)], reply.loss, reply.num_samples,
                           dict(reply.metrics), list(reply.devices))

