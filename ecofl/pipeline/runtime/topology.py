"""Who does what in a home pipeline: one :class:`WorkerRole` per device of a plan.

Derived once by the portal from (plan, pool, profile) and sent to each
worker as JSON, so a worker only executes (DeepSpeed's explicit topology
object, torch.distributed.pipelining's action lists):

- **ranks**: stage by stage, device by device, as the plan lists them;
- **samples**: each micro-batch's samples 0..B-1 are split over a stage's
  devices in contiguous ranges by ``shares``; device i of stage s sends to
  device j of stage s+1 the activations of the samples both ranges hold and
  j returns their gradients to i (Asteroid Fig. 10 and §4: every sample's
  forward and backward on one device per stage), exactly as the cost model
  (:mod:`ecofl.pipeline.cost`) assumes;
- **program**: the device's typed instructions (:mod:`ecofl.pipeline.instructions`),
  derived from its stage's action list of :mod:`ecofl.pipeline.schedule` and
  checked when a role is made (also from JSON: a worker runs only a
  well-formed program); where the plan's mode builds programs per call (an
  inference stream, an asynchronous 1F1B pass: :mod:`ecofl.pipeline.modes`) it
  has none: each call's program follows from its number of micro-batches (the
  worker builds and checks it), and for a
  stream ``resident_bound`` / ``next_hold`` are the micro-batches a device
  of this / the next stage holds at most (back-pressure, :mod:`.stream_stage`);
- **emulation targets**: what each operation must take on the emulated device
  (the cost model's own numbers when a profile is given), link rates, memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ecofl.devices import HomePool
from ecofl.pipeline.cost import stage_compute_s
from ecofl.pipeline.instructions import Program, check_program, program_from_json
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan, ScheduleKind, plan_schedule
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.schedule import Schedule


@dataclass(frozen=True)
class Peer:
    """A device of a neighbouring stage and the samples of each micro-batch shared with it."""

    rank: int
    device: int
    lo: int  # first shared sample of a micro-batch (index in the micro-batch)
    hi: int  # one past the last
    bandwidth_bps: float | None  # rate of the link towards that peer when emulating, else None


@dataclass(frozen=True)
class WorkerRole:
    """Everything one worker needs to run its part of every sync-round."""

    device: int
    device_name: str
    rank: int
    world_size: int
    stage: int
    num_stages: int
    layers: tuple[int, int]
    lo: int  # this device's samples of each micro-batch: lo..hi-1
    hi: int
    micro_batch: int
    num_micro_batches: int
    schedule: ScheduleKind
    program: Program  # this device's sync-round, instruction by instruction (ecofl.pipeline.instructions)
    resident_bound: int  # most forward tasks the program keeps resident (a stream: micro-batches held at most)
    sources: tuple[Peer, ...]  # devices of stage - 1 that send me activations
    destinations: tuple[Peer, ...]  # devices of stage + 1 I send activations to
    replicas: tuple[int, ...]  # ranks of every device of my stage (mine included)
    replica_weight: float  # my share / micro_batch (for averaging buffers)
    sleeps: bool  # sleep emulation: each operation lasts the cost model's time
    speed: float
    memory_bytes: int
    input_bps: float | None  # link from the portal (device 0) when emulating and not myself
    forward_s: float | None  # emulated seconds of my forward per micro-batch (None: real / speed)
    backward_s: float | None
    step_s: float | None
    allreduce_bps: float | None  # slowest link inside my stage when emulating a replicated stage
    next_hold: int = 0  # a stream: micro-batches each device of the next stage holds at most (0: last stage)
    output_bps: float | None = None  # a stream's last stage: the link back to the portal when emulating
    aggregate_every: int = 1  # asynchronous 1F1B: average the last S - s weight versions every this x (S - s) steps

    def __post_init__(self) -> None:
        if not mode_of(self).programs_per_call:
            check_program(self.program, self.stage, self.num_stages, replicated=len(self.replicas) > 1)

    @property
    def samples(self) -> int:
        return self.hi - self.lo

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["program"] = [instruction.to_json() for instruction in self.program]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "WorkerRole":
        data = dict(data)
        data["layers"] = tuple(data["layers"])
        data["schedule"] = ScheduleKind.from_str(data["schedule"])
        data["program"] = program_from_json(data["program"])
        data["sources"] = tuple(Peer(**p) for p in data["sources"])
        data["destinations"] = tuple(Peer(**p) for p in data["destinations"])
        data["replicas"] = tuple(data["replicas"])
        return cls(**data)


def worker_roles(
    plan: Plan, pool: HomePool, profile: ModelProfile | None, sleeps: bool, pace_links: bool | None = None,
    schedule: Schedule | None = None, aggregate_every: int = 1,
) -> list[WorkerRole]:
    """One role per device the plan uses, in rank order, each with its stage's actions of ``schedule``.

    ``schedule`` defaults to the plan's (:func:`ecofl.pipeline.plan.plan_schedule`); the portal passes
    the one it validated. ``sleeps`` gives each operation the cost model's time to sleep to;
    ``pace_links`` (default: as ``sleeps``) paces each link to the pool's rate, False leaves link rates
    to the kernel (:mod:`ecofl.net.netns`) or to the host (devices at host speed).
    """
    pace_links = sleeps if pace_links is None else pace_links
    used = [d for stage in plan.stages for d in stage.devices]
    if len(set(used)) != len(used):
        raise ValueError(f"a device may serve one stage only: {used}")
    if any(not 0 <= d < len(pool) for d in used):
        raise ValueError(f"plan uses devices {used}, pool {pool.name!r} has {len(pool)}")
    if profile is not None and profile.num_layers != plan.num_layers:
        raise ValueError(f"plan covers {plan.num_layers} layers, profile {profile.model!r} has {profile.num_layers}")
    rank_of = {d: r for r, d in enumerate(used)}
    ranges = [_ranges(stage.devices, stage.shares) for stage in plan.stages]
    mode = mode_of(plan)
    stream = mode.objective == "inference"
    if not mode.programs_per_call:
        schedule = plan_schedule(plan) if schedule is None else schedule

    def link(a: int, b: int) -> float | None:
        rate = float(pool.bandwidth_bps[a, b])
        return rate if pace_links and rate != float("inf") else None

    roles = []
    for s, stage in enumerate(plan.stages):
        last_stage = s == len(plan.stages) - 1
        program, bound = mode.stage_program(plan, schedule, s)
        for device, (lo, hi) in ranges[s].items():
            spec = pool.devices[device]
            forward = backward = step = None
            if sleeps and profile is not None:
                forward, backward = stage_compute_s(profile, spec, stage.layers, hi - lo)
                if profile.optimizer_step_s is not None:
                    first, last = stage.layers
                    step = float(profile.optimizer_step_s[first : last + 1].sum()) / spec.speed
            roles.append(
                WorkerRole(
                    device=device,
                    device_name=spec.name,
                    rank=rank_of[device],
                    world_size=len(used),
                    stage=s,
                    num_stages=len(plan.stages),
                    layers=stage.layers,
                    lo=lo,
                    hi=hi,
                    micro_batch=plan.micro_batch,
                    num_micro_batches=plan.num_micro_batches,
                    schedule=plan.schedule,
                    program=program,
                    resident_bound=bound,
                    sources=_peers(ranges[s - 1], lo, hi, rank_of, lambda d, me=device: link(me, d)) if s else (),
                    destinations=(
                        _peers(ranges[s + 1], lo, hi, rank_of, lambda d, me=device: link(me, d))
                        if s + 1 < len(plan.stages)
                        else ()
                    ),
                    replicas=tuple(rank_of[d] for d in stage.devices),
                    replica_weight=(hi - lo) / plan.micro_batch,
                    sleeps=sleeps,
                    speed=spec.speed,
                    memory_bytes=spec.memory_bytes,
                    input_bps=link(0, device) if s == 0 and device != 0 else None,
                    forward_s=forward,
                    backward_s=backward,
                    step_s=step,
                    allreduce_bps=_slowest_link(pool, stage.devices) if pace_links and len(stage.devices) > 1 else None,
                    next_hold=0 if last_stage else plan.stages[s + 1].in_flight,
                    output_bps=link(device, 0) if stream and last_stage and device != 0 else None,
                    aggregate_every=aggregate_every,
                )
            )
    return roles


def _ranges(devices: tuple[int, ...], shares: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    out, lo = {}, 0
    for device, share in zip(devices, shares):
        out[device] = (lo, lo + share)
        lo += share
    return out


def _peers(ranges: dict[int, tuple[int, int]], lo: int, hi: int, rank_of: dict[int, int], link) -> tuple[Peer, ...]:
    """Devices whose sample range overlaps lo..hi-1, with the overlap."""
    peers = []
    for device, (a, b) in ranges.items():
        first, last = max(a, lo), min(b, hi)
        if first < last:
            peers.append(Peer(rank_of[device], device, first, last, link(device)))
    return tuple(peers)


def _slowest_link(pool: HomePool, devices: tuple[int, ...]) -> float:
    """The slowest link between two devices of a replicated stage (its ring all-reduce's pace)."""
    return min(float(pool.bandwidth_bps[a, b]) for a in devices for b in devices if a != b)
