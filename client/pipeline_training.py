"""Training a home's round through the real pipeline runtime instead of in one process.

Selected homes of a simulation run the round's training as the design's
"Run" step does: one worker process per device of the home's pool,
activations and gradients over the home's sealed tensor links
(:class:`ecofl.pipeline.runtime.HomePipeline`), on emulated devices started
here for the round and stopped after it (also on failure): confined by
cgroups, sleeping to the cost model or at host speed (``pipeline_home.emulate``). The update is the
one :func:`ecofl.train.train_local` computes for the same message
(:mod:`ecofl.pipeline.runtime.round_training` says how), so a federation may
mix both kinds of homes. Which homes do this is the setup's ``pipeline_home``
section (:class:`~ecofl.fl.federation_setup.PipelineHomeSettings`). The plan
(profile, pool, planner) is made once per process and cached.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import torch

from ecofl.cgroups import DeviceLimits
from ecofl.device_dynamics import resolve_pool
from ecofl.devices import HomePool
from ecofl.fl.federation_setup import PipelineHomeSettings
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model
from ecofl.pipeline.runtime import HomePipeline, ZooModel
from ecofl.pipeline.runtime.calibration import confine_pool, plan_on_measured_speeds
from ecofl.pipeline.runtime.emulation import Emulation, default_emulation
from ecofl.net.liveness import LivenessSettings
from ecofl.pipeline.runtime.faults import FaultTolerance
from ecofl.pipeline.runtime.prediction import plan_as_run
from ecofl.pipeline.runtime.round_training import PipelineTraining, train_round
from ecofl.train import TrainConfig
from ecofl.weights import Weights


@lru_cache(maxsize=32)
def home_plan(
    model: str, input_shape: tuple[int, ...], num_classes: int, granularity: str, pool_name: str, planner: str,
    batch_size: int, emulation: Emulation = Emulation.SLEEP,
) -> tuple[HomePool, ModelProfile, Plan, dict[int, DeviceLimits] | None]:
    """The pool, the host profile, the plan for one mini-batch size and, confined, the devices' limits (once per
    process; confined devices first time the model in their cgroups and the plan is made on those speeds). The
    plan is made as ``ecofl home train`` makes it (:func:`~ecofl.pipeline.runtime.prediction.plan_as_run`):
    where devices compute for real, at the micro-batch size predicted fastest with the runtime's overheads, and
    confined, on the devices that make it fastest."""
    profile = profile_zoo_model(model, tuple(input_shape), num_classes, granularity)
    pool = resolve_pool(pool_name)
    if emulation != Emulation.CGROUP:
        return pool, profile, plan_as_run(planner, profile, pool, batch_size, emulation), None
    spec = ZooModel(model, tuple(input_shape), num_classes, granularity)
    confined, plan = plan_on_measured_speeds(
        lambda devices: plan_as_run(planner, profile, devices, batch_size, Emulation.CGROUP), profile, pool,
        lambda work: confine_pool(spec, tuple(input_shape), profile, pool, work))
    return confined.pool, profile, plan, confined.limits


@lru_cache(maxsize=1)
def resolved_emulation(setting: str) -> Emulation:
    """The setting's mode; ``auto`` as this machine allows, said once per process in the log."""
    if setting != "auto":
        return Emulation.parse(setting)
    mode, line = default_emulation()
    logging.getLogger(__name__).info("pipeline homes: %s", line)
    return mode


#: The pipeline homes of a simulation share one machine with each other and with Flower: a live device there can
#: go without CPU for seconds, so its heartbeat silence is bounded at 10 s, not a real device's default 2 s (a
#: live device was once declared lost with three test processes on two cores).
SHARED_HOST_HEARTBEAT = LivenessSettings(period_s=0.2, suspect_after_s=5.0, probe_timeout_s=5.0)


def train_through_pipeline(
    settings: PipelineHomeSettings,
    pool_name: str,
    model: ZooModel,
    weights: Weights,
    x: torch.Tensor,
    y: torch.Tensor,
    config: TrainConfig,
    planner: str,
) -> PipelineTraining:
    """``train_local(model, x, y, config)`` from ``weights``, computed by the home's pipeline."""

    mode = resolved_emulation(settings.emulate)

    def open_pipeline(size: int) -> HomePipeline:
        pool, profile, plan, limits = home_plan(model.name, tuple(model.input_shape), model.num_classes,
                                                model.granularity, pool_name, planner, size, mode)
        return HomePipeline(model, pool, plan, profile=profile, emulate=mode, limits=limits,
                            timeout_s=settings.timeout_s,
                            fault_tolerance=FaultTolerance(planner=planner, heartbeat=SHARED_HOST_HEARTBEAT)
                            if settings.fault_tolerance else None)

    return train_round(open_pipeline, weights, x, y, config, pool_name)
