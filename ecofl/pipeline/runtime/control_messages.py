"""The control protocol between the portal and a worker: one typed message per request and reply.

Every message is a frozen dataclass (:mod:`ecofl.net.schema`) sent as a
JSON header on the sealed control channel, with its tensors as raw arrays
beside it (:mod:`ecofl.net.wire`); a message is validated when it arrives,
so a malformed one is refused with its type and field named. The requests
and the replies they get::

    Config       the model spec, limits, heartbeat          -> Ready (my data port)
    Epoch        a pipeline epoch: role, rank, data ports   -> Entered
    Setup        stage weights (+ FedProx reference)        -> Ok
    Load         stage weights (inference)                  -> Loaded
    Infer        stage 0: inputs; stream the micro-batches  -> Inferred (+ outputs)
    TrainPass    stage 0: inputs; last stage: labels; the   -> CopyPiece... (global copy), Done
                 replicas to send and keep and the global
                 copy to send while it runs
    Collect      my stage's weights                         -> StageWeights
    GetState     layers' state at a version                 -> State
    Reconfigure  a new epoch from a committed version       -> Reconfigured
    Arm          a phase-targeted failure (:mod:`.traps`)   -> Armed
    Abort        stop whatever runs                         -> Interrupted (+ my committed copies)
    Stop         the session is over

A request that cannot finish (a lost peer, an abort) is answered
``Interrupted``; a worker about to die by a trap says ``Trapped``; one that
fails says ``Error`` and ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from ecofl.net.schema import JsonObject, Matches, MessageSet, message
from ecofl.pipeline.runtime.stage import Optimization


# -- requests (portal -> worker) --------------------------------------------------------------------


@message("config")
class Config:
    model: JsonObject  # :meth:`ModelSpec.to_json`
    timeout_s: float
    snapshots: bool  # keep committed copies (fault tolerance)
    heartbeat: tuple[str, int, float] | None  # the monitor's host, port and beat period
    accelerator: Annotated[str, Matches(r"cpu|cuda(:\d+)?")] = "cpu"  # where the worker's tensors live


@message("epoch")
class Epoch:
    epoch: int
    role: JsonObject | None  # :meth:`WorkerRole.to_json`; None: idle in this epoch
    rank: int
    addresses: list[tuple[str, int]]  # every rank's data port


@message("setup")
class Setup:
    optimization: Optimization


@message("load")
class Load:
    pass


@message("infer")
class Infer:
    num_micro_batches: int


@dataclass(frozen=True)
class Replicate:
    """The replicas of a sync-round (:mod:`.replica`): my stage at ``version`` to my backups, others' to me."""

    version: int
    to: list[int]  # the ranks of my backups (none: my stage has peers, or the plan one stage)
    sources: list[tuple[int, int, int, int]]  # (device, rank, first layer, last layer) I back up
    link_bps: float | None


@dataclass(frozen=True)
class GlobalCopy:
    """My stage at the round's version to the portal while the round computes (:mod:`.global_copy`)."""

    link_bps: float | None  # my emulated link rate to the portal (None: not paced)


@message("train_pass")
class TrainPass:
    """Train one batch of micro-batches from a committed version: a sync-round of 1F1B-Sync or GPipe (ended by
    its flush), or one pass of asynchronous 1F1B (each micro-batch's update after its backward)."""

    version: int  # the committed version the round starts from
    batch_size: int
    num_micro_batches: int
    slowdown: float = 1.0
    keep: tuple[int, ...] = ()  # other committed versions whose copies must stay
    replicate: Replicate | None = None  # the replicas that travel while the round computes
    global_copy: GlobalCopy | None = None  # my stage for the portal's global copy, sent while the round computes


@message("collect")
class Collect:
    link_bps: float | None = None  # the worker's emulated link rate to the portal (None: not paced)


@message("get_state")
class GetState:
    version: int
    layers: list[int]
    link_bps: float | None


@message("reconfigure")
class Reconfigure:
    epoch: int
    role: JsonObject | None
    rank: int
    addresses: list[tuple[str, int]]
    restore: int  # the committed version to roll back to
    moves: list[tuple[int, int, int]]  # (layer, from rank, to rank)
    optimization: Optimization
    link_bps: float | None
    recovery: bool


@message("arm")
class Arm:
    signal: str
    phase: str
    count: int


@message("abort")
class Abort:
    token: int | None


@message("stop")
class Stop:
    pass


# -- replies (worker -> portal) ---------------------------------------------------------------------


@message("ready")
class Ready:
    data: tuple[str, int]  # my data port


@message("entered")
class Entered:
    pass


@message("ok")
class Ok:
    pass


@message("loaded")
class Loaded:
    pass


@message("inferred")
class Inferred:
    events: list[tuple[str, int, float, float]]  # kind, micro-batch, start, end
    peak_held: int
    peak_rss_bytes: int | None
    baseline_rss_bytes: int | None


@message("done")
class Done:
    events: list[tuple[str, int, float, float]]
    loss_sum: float
    peak_resident: int
    peak_activation_bytes: int
    fixed_bytes: int
    peak_rss_bytes: int | None
    baseline_rss_bytes: int | None
    weight_versions: list[tuple[int, int, int]]
    peak_accelerator_bytes: int | None = None  # measured by torch on the worker's GPU (None on a CPU)
    replica_after_s: float | None = None  # when the replicas kept here were complete, from the round's start
    cpu_s: float | None = None  # measured: the worker process's CPU time (every thread) during the sync-round
    cpu_s_by_job: dict[str, float] | None = None  # measured: the same by what each thread does (:mod:`.thread_cpu`)
    global_copy_after_s: float | None = None  # when my stage's global copy was sent, from the round's start
    first_touched_bytes: int | None = None  # measured: memory the process touched for the first time in the round
    pass_cpu_s: float | None = None  # measured: the stage thread's CPU seconds in its forwards and backwards


@message("copy_piece")
class CopyPiece:
    """Part of my stage's state at ``version`` for the portal's global copy, as arrays (:mod:`.global_copy`);
    ``last``: my stage's copy is complete with it."""

    version: int
    last: bool


@message("stage_weights")
class StageWeights:
    """A device's weights of its stage at ``version``, as arrays (the answer to :class:`Collect`)."""

    version: int


@message("state")
class State:
    pass


@message("reconfigured")
class Reconfigured:
    received_bytes: int
    seconds: float  # from the request to this answer
    linking_s: float  # of which entering the epoch's links


@message("armed")
class Armed:
    pass


@message("interrupted")
class Interrupted:
    reason: str
    token: int | None
    holdings: dict[str, list[int]]  # committed version -> the layers I hold at it


@message("trapped")
class Trapped:
    signal: str
    phase: str
    time: float  # when the trap struck (time.time())


@message("error")
class Error:
    kind: str
    message: str
    device: int
    time: float


REQUESTS = MessageSet(Config, Epoch, Setup, Load, Infer, TrainPass, Collect, GetState, Reconfigure, Arm,
                      Abort, Stop)
REPLIES = MessageSet(Ready, Entered, Ok, Loaded, Inferred, Done, CopyPiece, StageWeights, State, Reconfigured,
                     Armed, Interrupted, Trapped, Error)

Request = (Config | Epoch | Setup | Load | Infer | TrainPass | Collect | GetState | Reconfigure | Arm
           | Abort | Stop)
Reply = (Ready | Entered | Ok | Loaded | Inferred | Done | CopyPiece | StageWeights | State | Reconfigured | Armed
         | Interrupted | Trapped | Error)
