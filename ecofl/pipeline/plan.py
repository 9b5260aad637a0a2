"""A pipeline plan as plain data: which devices run which layers, how.

Every planner (ecofl, hpp, pipeedge, even, dp) returns a :class:`Plan`; the
cost model simulates it, the runtime executes it, tests inspect it.

A stage is a contiguous range of layers replicated over one or more devices
(Asteroid's hybrid pipeline parallelism: data parallel inside a stage,
pipeline across stages). Each micro-batch of ``micro_batch`` samples is split
over the stage's devices by ``shares`` (samples per device, summing to
``micro_batch``); a single-device stage has ``shares == (micro_batch,)``.
A data-parallel plan is one stage holding every device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StagePlan:
    layers: tuple[int, int]  # first and last layer, inclusive
    devices: tuple[int, ...]  # indices into HomePool.devices
    shares: tuple[int, ...]  # samples of each micro-batch per device
    in_flight: int  # K_p: forward tasks resident at most (Eco-FL eq. 3, Asteroid eq. 3)

    def __post_init__(self) -> None:
        first, last = self.layers
        if not 0 <= first <= last:
            raise ValueError(f"bad layer range {self.layers}")
        if not self.devices or len(self.devices) != len(self.shares):
            raise ValueError(f"stage needs one share per device: {self.devices} vs {self.shares}")
        if any(s < 0 for s in self.shares) or sum(self.shares) == 0:
            raise ValueError(f"shares must be non-negative with a positive sum: {self.shares}")
        if self.in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {self.in_flight}")


@dataclass(frozen=True)
class Plan:
    planner: str
    stages: tuple[StagePlan, ...]
    micro_batch: int  # samples per micro-batch
    num_micro_batches: int  # M per sync-round (mini-batch = micro_batch * M)
    schedule: str = "1f1b"  # "1f1b" (1F1B-Sync) or "gpipe" (backward after forward)

    def __post_init__(self) -> None:
        if not self.stages:
            raise ValueError("a plan needs at least one stage")
        for before, after in zip(self.stages, self.stages[1:]):
            if after.layers[0] != before.layers[1] + 1:
                raise ValueError(f"stages must cover consecutive layers: {before.layers} {after.layers}")
        if self.stages[0].layers[0] != 0:
            raise ValueError("the first stage must start at layer 0")
        for stage in self.stages:
            if sum(stage.shares) != self.micro_batch:
                raise ValueError(f"stage shares {stage.shares} do not sum to {self.micro_batch}")
        if self.schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"unknown schedule {self.schedule!r}")

    @property
    def batch_size(self) -> int:
        return self.micro_batch * self.num_micro_batches

    @property
    def num_layers(self) -> int:
        return self.stages[-1].layers[1] + 1

    def to_dict(self) -> dict:
        return asdict(self)
