"""Fault tolerance settings, injected events and what the portal records of each (plain data).

One mechanism, two triggers (Eco-FL §4.4; Asteroid §3.4; FTPipeHD §III-D to
III-F): a device that is *slow* (a sustained deviation of its measured stage
time from what the plan expects) or *gone* (heartbeat silence plus a failed
probe, or a closed channel) makes the portal re-plan and migrate layers, and
a failure rolls the pipeline back to its last committed sync-round and
replays from there.

Injections reproduce the papers' experiments on emulated homes:
``kill:D@R`` (``kill -9`` of device D's worker as sync-round R starts),
``freeze:D@R`` (``SIGSTOP``), ``slow:D*F@R`` (device D computes F times
slower from sync-round R on), ``join:D@R`` (device D, not in the plan, joins
before sync-round R).

A kill or freeze can also be aimed at a phase of the device's work:
``kill:D@R:PHASE[:K]`` makes device D kill (or freeze) itself when it
reaches its K-th (default 1st) PHASE from sync-round R on
(:mod:`.traps`): ``forward``, ``backward``, ``send`` (right after posting a
send), ``allreduce`` (entering a replicated stage's all-reduce), ``step``
(right after its optimizer step, before the portal hears of it),
``replicate`` (mid-copy to its backups), ``global-copy`` (its stage on the
way to the portal's global copy), ``migrate`` (mid layer migration of a re-plan)
or ``recover`` (as it starts re-configuring for a recovery: a second
failure while recovering from a first).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field

from ecofl import names
from ecofl.errors import UserError
from ecofl.net.liveness import LivenessSettings
from ecofl.pipeline.replan import REPLAN_KINDS
from ecofl.pipeline.replication import BACKUP_RULES

from ecofl.pipeline.runtime.traps import PHASES

INJECTION_KINDS = ("kill", "freeze", "slow", "join")
INJECTION_SYNTAX = names.INJECTION_SYNTAX
_INJECTION = re.compile(r"^(kill|freeze|join):(\d+)@(\d+)(?::([a-z-]+)(?::(\d+))?)?$|^slow:(\d+)\*([0-9.]+)@(\d+)$")


@dataclass(frozen=True)
class FaultTolerance:
    """How a home pipeline watches, backs up and re-plans itself.

    ``replicate_every``: sync-rounds between topology-driven replications
    (0: none, recovery then needs the global copy); ``global_copy_every``:
    G, sync-rounds between copies of the whole model at the portal (0:
    none); ``replan``: lightweight, full or heavy (the baseline) after a
    failure; ``adapt``: re-plan when a device stays ``slowdown_ratio`` times
    slower than expected for ``slowdown_rounds`` sync-rounds, with
    ``adapt_replan`` (full by default: Eco-FL §4.4 re-runs its planner for a
    new device order and partition; lightweight keeps the order and moves
    cut points by FLOPs); ``planner``: what full and heavy re-plans run (where devices are confined,
    with Asteroid's hybrid plans weighed beside its own: :func:`.prediction.preferred_plan`); ``backups``:
    where a stage with two neighbours is backed up (:data:`~ecofl.pipeline.replication.BACKUP_RULES`: sparing
    the plan's busiest device, which costs every round less, or on both, which moves less at a neighbour's loss).
    """

    heartbeat: LivenessSettings = field(default_factory=LivenessSettings)
    replicate_every: int = 1
    global_copy_every: int = 5
    replan: str = "lightweight"
    adapt: bool = True
    adapt_replan: str = "full"
    slowdown_ratio: float = 1.5
    slowdown_rounds: int = 2
    planner: str = "ecofl"
    backups: str = BACKUP_RULES[0]

    def __post_init__(self) -> None:
        if self.replan not in REPLAN_KINDS or self.adapt_replan not in REPLAN_KINDS[:2]:
            raise UserError(f"replan must be one of {', '.join(REPLAN_KINDS)} (adapt_replan: lightweight or full)")
        if self.replicate_every < 0 or self.global_copy_every < 0 or self.slowdown_rounds < 1:
            raise UserError("replicate_every and global_copy_every must be >= 0, slowdown_rounds >= 1")
        if self.backups not in BACKUP_RULES:
            raise UserError(f"backups must be one of {', '.join(BACKUP_RULES)}, got {self.backups!r}")
        if not self.slowdown_ratio > 1:
            raise UserError(f"slowdown_ratio must be above 1, got {self.slowdown_ratio}")


@dataclass(frozen=True)
class Injection:
    """An event injected into an emulated home at the start of sync-round ``round`` (or, with a ``phase``,
    at the ``count``-th time device ``device`` reaches that phase from sync-round ``round`` on)."""

    kind: str  # kill | freeze | slow | join
    device: int
    round: int
    factor: float = 1.0  # slow: the device's times are multiplied by this
    phase: str | None = None  # kill / freeze: one of traps.PHASES (None: as the sync-round starts)
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> "Injection":
        """One of :data:`INJECTION_SYNTAX`; anything else is a UserError."""
        match = _INJECTION.match(text.strip())
        if match is None:
            raise UserError(f"bad event {text!r}: expected {INJECTION_SYNTAX}")
        kind, device, round_, phase, count = match.group(1, 2, 3, 4, 5)
        if kind:
            if phase is not None and (kind == "join" or phase not in PHASES):
                raise UserError(f"bad event {text!r}: a kill or freeze may name a phase, one of {', '.join(PHASES)}")
            if count is not None and int(count) < 1:
                raise UserError(f"bad event {text!r}: K counts from 1")
            return cls(kind, int(device), int(round_), phase=phase, count=int(count or 1))
        factor = float(match.group(7))
        if not factor > 0:
            raise UserError(f"bad event {text!r}: the slow-down factor must be positive")
        return cls("slow", int(match.group(6)), int(match.group(8)), factor)


def _named(event: Injection) -> str:
    return f"{event.kind}:{event.device}@{event.round}"


def check_devices(injections: Sequence[Injection], pool_size: int) -> None:
    """Every injected event names a device of the pool (a UserError otherwise)."""
    for event in injections:
        if not 0 <= event.device < pool_size:
            raise UserError(f"{_named(event)} names device {event.device}: the home's devices are 0-{pool_size - 1}")


def check_targets(injections: Sequence[Injection], plan_devices: Collection[int], pool_size: int) -> None:
    """Every injected event names a device of the pool; a kill, freeze or slow-down one with a stage by then (in
    the plan the pipeline starts from, or joined at an earlier or the same sync-round); a join one out of the
    pipeline by then (not in that plan, or killed or frozen before). Otherwise the event would strike nothing
    (device selection may leave a device out of the plan): a UserError before any round."""
    check_devices(injections, pool_size)
    for event in injections:
        named = _named(event)
        joins = any(e.kind == "join" and e.device == event.device and e.round <= event.round for e in injections)
        if event.kind != "join" and event.device not in plan_devices and not joins:
            raise UserError(f"{named}: device {event.device} has no stage in the plan (device selection may have "
                            f"left it out), so nothing would be struck; it can be after it joins "
                            f"(join:{event.device}@R)")
        lost = any(e.kind in ("kill", "freeze") and e.device == event.device and e.round < event.round
                   for e in injections)
        if event.kind == "join" and event.device in plan_devices and not lost:
            raise UserError(f"{named}: device {event.device} is in the pipeline already; it can join again after "
                            f"a kill or freeze")


@dataclass(frozen=True)
class Reconfiguration:
    """What entering a pipeline epoch took: the bytes that crossed a link (as received) and, per device, its own
    seconds from the request to its answer and the part of them it spent entering the epoch's links."""

    moved: int
    seconds: dict[int, float]
    linking_s: dict[int, float]


@dataclass
class FaultEvent:
    """What happened to one injected or detected event, and how the pipeline recovered.

    Times are seconds after the event (its injection, or the last sign of
    life of a device found failed without injection); throughputs are
    samples/s over the sync-rounds before the event and after the recovery.
    """

    kind: str  # kill | freeze | slow | join | failure (found, not injected)
    device: int
    round: int
    phase: str | None = None  # where an aimed kill or freeze struck (traps.PHASES)
    # wall-clock time (time.time()) it struck; for a failure found: its last sign of life
    struck_at: float | None = None
    detected_after_s: float | None = None
    cause: str | None = None  # why a lost device was declared lost: its channel closed, its process exited, ...
    resumed_after_s: float | None = None  # until the first sync-round after the recovery started (FTPipeHD's)
    stopping_s: float | None = None  # a recovery's survivors aborted and answered with what they hold
    recovered_after_s: float | None = None  # until the first sync-round completed after the recovery
    replan: str | None = None  # lightweight | full | heavy
    rescheduling_s: float | None = None  # re-planning and migrating, until every device is reconfigured
    planning_s: float | None = None  # of rescheduling_s: choosing the new plan
    reconfigured_s: dict[int, float] = field(default_factory=dict)  # each device's own time entering the epoch
    linking_s: dict[int, float] = field(default_factory=dict)  # of that: opening the epoch's links
    bytes_moved: int = 0
    lost_rounds: int = 0  # completed sync-rounds computed again (restored from an older version)
    # where the lost device's layers were restored from: [{"layers": [first, last], "source": "peer" | "backup"
    # | "global copy", "device": the holder (None: the portal), "version": v}]
    restored_from: list[dict] = field(default_factory=list)
    throughput_before: float | None = None
    throughput_after: float | None = None

    def rescheduled(self, replan: str, planning_s: float, rescheduling_s: float, done: Reconfiguration) -> None:
        """Record a re-plan of kind ``replan`` that took ``rescheduling_s``, ``planning_s`` of it choosing the plan
        and the rest entering the epoch (``done``)."""
        self.replan, self.planning_s, self.rescheduling_s = replan, planning_s, rescheduling_s
        self.bytes_moved, self.reconfigured_s, self.linking_s = done.moved, done.seconds, done.linking_s

    def to_dict(self) -> dict:
        return asdict(self)
