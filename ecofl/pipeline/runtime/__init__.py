"""Runs a plan for real: one process per device, torch.distributed (gloo) between them.

- :mod:`.portal`: :class:`HomePipeline`, the API the Flower client calls;
- :mod:`.worker`: a device's process; :mod:`.stage`: its executor of one sync-round;
- :mod:`.topology`: who does what (ranks, sample ranges, action lists);
- :mod:`.comm`: point-to-point tensors; :mod:`.emulation`: emulated devices;
- :mod:`.auth`, :mod:`.wire`: the authenticated control channel; :mod:`.launch`:
  starting and stopping worker processes; :mod:`.model_spec`: the model as data.
"""

from ecofl.pipeline.runtime.errors import (
    AuthenticationFailed,
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
    "AuthenticationFailed",
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
