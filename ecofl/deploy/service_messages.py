"""The home service's protocol: typed messages between the service, its device daemons and its clients.

Every message is a frozen dataclass (:mod:`ecofl.net.schema`) on an
authenticated, sealed channel (:mod:`ecofl.net.auth`), validated on receipt
so a malformed one is refused naming its type and field::

    daemon  -> service   Register (name, preset or measured workload and first touch, memory, link)
                         -> Registered (id, speed)
    daemon  -> service   DaemonBeat, every few seconds (sessions served)
    service -> daemon    Session (join the portal at this address as device d), Bye
    client  -> service   StatusRequest -> HomeStatus;  Train (+ weights, data) -> Trained (+ weights) or ServiceError
"""

from __future__ import annotations

from typing import Annotated

from ecofl.net.schema import JsonObject, Matches, MessageSet, Within, message
from ecofl.train_config import TrainConfig

DAEMON = "device daemon"  # the purpose a device daemon's handshake proves
CLIENT = "home client"  # the purpose the home's ClientApp (or `ecofl home status`) proves
DAEMON_BEAT_S = 1.0  # a device daemon beats this often on its channel to the home service


@message("register")
class Register:
    name: str
    preset: str | None  # a preset's numbers, or (None) this machine's measured workload
    memory_bytes: int
    bandwidth_bps: float
    speed: float | None = None
    workload_s: float | None = None
    accelerator: Annotated[str, Matches(r"cpu|cuda(:\d+)?")] = "cpu"  # where its worker trains (its own GPU)
    # seconds it takes to map a byte of memory for the first time (measured; None: not, e.g. a preset); at most
    # 1 us, a second a MiB (a device measures some 1-10 ns: a figure beyond would make it look unusable)
    first_touch_s_per_byte: Annotated[float, Within(0.0, 1e-6)] | None = None


@message("registered")
class Registered:
    id: int
    speed: float


@message("name_taken")
class NameTaken:
    """A registration refused: a device of that name is joined and beating (names are identities in a home)."""

    name: str


@message("beat")
class DaemonBeat:
    sessions: int


@message("session")
class Session:
    """Join the portal at ``portal`` as ``device`` (the service tells a daemon so, and the daemon hands it on to
    its warm worker: :mod:`ecofl.pipeline.runtime.pipe_messages`)."""

    portal: tuple[str, int]
    device: int


@message("bye")
class Bye:
    pass


@message("status")
class StatusRequest:
    pass


@message("home_status")
class HomeStatus:
    name: str
    rounds: int
    sessions: int
    sync_rounds: int
    refused: int
    devices: list[JsonObject]
    round_log: list[JsonObject]


@message("train")
class Train:
    model: JsonObject  # :meth:`ModelSpec.to_json`
    train: TrainConfig
    num_weights: int


@message("trained")
class Trained:
    num_weights: int
    loss: float
    num_samples: int
    metrics: JsonObject
    devices: list[str]


@message("error")
class ServiceError:
    message: str


FROM_DAEMON = MessageSet(Register, DaemonBeat)
TO_DAEMON = MessageSet(Registered, NameTaken, Session, Bye)
FROM_CLIENT = MessageSet(StatusRequest, Train)
TO_CLIENT = MessageSet(HomeStatus, Trained, ServiceError)
