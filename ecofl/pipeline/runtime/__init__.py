"""Runs a plan for real: one process per device, authenticated and sealed tensor links between them.

- :mod:`.portal`: :class:`HomePipeline`, the API the Flower client calls;
- :mod:`.worker`: a device's process; :mod:`.stage`: its executor of one sync-round;
- :mod:`.topology`: who does what (ranks, sample ranges, action lists);
- :mod:`.emulation`: emulated devices; :mod:`.launch`: starting and stopping
  worker processes; :mod:`.model_spec`: the model as data.

The channels between the processes (handshake, sealing, framing), the tensor
links and the heartbeats are the network layer's: :mod:`ecofl.net`.
"""

from ecofl.pipeline.runtime.errors import (
    DeviceUnreachable,
    EmulatedOOM,
    HomePipelineError,
    WorkerDied,
    WorkerFailed,
    WorkerTimeout,
)
from ecofl.pipeline.runtime.model_spec import LayerList, ModelSpec, ZooModel
from ecofl.pipeline.runtime.portal import HomePipeline, PipelineResult

__all__ = [
    "DeviceUnreachable",
    "EmulatedOOM",
    "HomePipeline",
    "HomePipelineError",
    "LayerList",
    "ModelSpec",
    "PipelineResult",
    "WorkerDied",
    "WorkerFailed",
    "WorkerTimeout",
    "ZooModel",
]
