"""Which device runs which part of the model: the plan in force, each worker's role, each layer's state keys.

The portal's data about a home pipeline, apart from its processes
(:mod:`.control_plane`): the plan the workers run (a training plan's
schedule is validated before it is taken), the role of every device of it
(:func:`.topology.worker_roles`), the ``state_dict`` keys of every layer and
stage, and what a device needs to enter a pipeline epoch. The drivers
(:mod:`.portal`) and the recovery (:mod:`.recovery`) both read it; a re-plan
replaces the plan (:meth:`PipelineLayout.use_plan`).
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from ecofl.devices import HomePool
from ecofl.pipeline.migration import Holders
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan, plan_schedule
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime.control_messages import Epoch
from ecofl.pipeline.runtime.model_spec import layer_state_keys
from ecofl.pipeline.runtime.topology import worker_roles
from ecofl.pipeline.schedule import validate


class PipelineLayout:
    """``plan`` over ``pool`` for the model ``full_model`` cut into ``layers``.

    ``sleeps`` says whether the workers sleep to the cost model's times and
    ``pace_links`` whether they pace their links (the roles carry the targets);
    ``aggregate_every`` is asynchronous 1F1B's weight aggregation period.
    """

    def __init__(self, full_model: nn.Module, layers: list[nn.Module], pool: HomePool, plan: Plan,
                 profile: ModelProfile | None, *, sleeps: bool, pace_links: bool, aggregate_every: int = 1):
        if len(layers) != plan.num_layers:
            raise ValueError(f"the plan covers {plan.num_layers} layers, the model has {len(layers)}")
        self.pool, self.profile, self.sleeps, self.pace_links = pool, profile, sleeps, pace_links
        self.aggregate_every = aggregate_every  # FTPipeHD §III-C
        self.keys = list(full_model.state_dict().keys())
        self.layer_keys = layer_state_keys(full_model, layers)
        self.parameter_keys = {k for k, _ in full_model.named_parameters()}
        self.stateful = [layer for layer, keys in enumerate(self.layer_keys) if keys]
        self.use_plan(plan)

    def use_plan(self, plan: Plan) -> None:
        """Make ``plan`` the one the workers run (a training schedule is validated first: a bad one is refused;
        an inference plan's stream program follows from each call's length)."""
        schedule, mode = None, mode_of(plan)
        if not mode.programs_per_call:
            schedule = plan_schedule(plan)
            validate(schedule, plan.num_micro_batches, mode.validated_in_flight(plan))
        self.plan = plan
        self.roles = worker_roles(plan, self.pool, self.profile, self.sleeps, pace_links=self.pace_links,
                                  schedule=schedule, aggregate_every=self.aggregate_every)
        self.stage_keys = [self.keys_of(stage.layers) for stage in plan.stages]

    @property
    def devices(self) -> list[int]:
        """The plan's devices, in rank order."""
        return [role.device for role in self.roles]

    def holders(self) -> Holders:
        """Who holds each stateful layer between sync-rounds: every device of its stage, at the current version."""
        return {layer: list(stage.devices) for stage in self.plan.stages
                for layer in range(stage.layers[0], stage.layers[1] + 1) if layer in self.stateful}

    def keys_of(self, layers: tuple[int, int]) -> list[str]:
        """The state keys of the layers ``layers[0]`` .. ``layers[1]``."""
        return self.keys_of_layers(range(layers[0], layers[1] + 1))

    def keys_of_layers(self, layers: Iterable[int]) -> list[str]:
        return [k for layer in sorted(layers) for k in self.layer_keys[layer]]

    def reference_keys(self, stage: int) -> list[str]:
        """The keys of ``stage`` whose FedProx reference its workers need: its parameters."""
        return [k for k in self.stage_keys[stage] if k in self.parameter_keys]

    def epoch(self, epoch: int, device: int, world: list[int], data_ports: dict[int, tuple[str, int]]) -> Epoch:
        """What ``device`` needs to enter ``epoch``: its role (None: idle in this plan), its rank in ``world``
        (the ranks of the epoch, the plan's devices first), and every rank's data port."""
        role = next((r for r in self.roles if r.device == device), None)
        return Epoch(epoch, role.to_json() if role is not None else None, world.index(device),
                     [data_ports[d] for d in world])

    def link_rate(self, device: int) -> float | None:
        """``device``'s emulated link rate (bytes/s) for moving state; None when links are not paced."""
        if not self.pace_links:
            return None
        return float(self.pool.devices[device].bandwidth_bps)
