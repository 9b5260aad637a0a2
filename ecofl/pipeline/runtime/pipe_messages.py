"""The messages on the pipes between a process of a home and the helpers it starts, one JSON object a line,
typed and checked by the schema that checks every message (:mod:`ecofl.net.schema`):

- the portal and its worker fork server (:mod:`.worker_forks`): ``Fork`` -> ``Forked`` or ``ForkFailed``, and
  ``Exited`` when a forked worker ends;
- a device daemon and its warm workers (:mod:`ecofl.deploy.warm_workers`, ``worker --sessions``):
  ``Session`` -> ``SessionFree`` (also once when the worker is ready);
- the portal and a device timing its work in its cgroup (:mod:`.calibration`): ``Timed`` (ready), ``Go``,
  ``Timed`` (the seconds per step).
"""

from __future__ import annotations

import json
from typing import IO, Any

from ecofl.deploy.service_messages import Session  # the service's message, handed on by a daemon to its worker
from ecofl.net.schema import MalformedMessage, MessageSet, encode, message


@message("fork")
class Fork:
    id: int
    argv: list[str]
    env: dict[str, str]
    log: str  # the worker's log file
    name: str  # its process name
    cgroup_procs: list[str]  # cgroup.procs files to enter before it allocates
    namespace: str | None  # a network namespace to enter


@message("forked")
class Forked:
    id: int
    pid: int


@message("fork-failed")
class ForkFailed:
    id: int
    error: str


@message("exited")
class Exited:
    pid: int
    code: int


@message("free")
class SessionFree:
    """The warm worker can take a session: it is ready, or its last session is over."""


@message("go")
class Go:
    """Every device is ready: time now, all together."""


@message("timed")
class Timed:
    seconds_per_step: float | None  # None: ready to time (its work built, its first step run)
    # ready: the CPU per byte of a fresh mapping's first write beyond its second (.process_memory); timed: None
    first_touch_cpu_s_per_byte: float | None = None
    # timed: the process's CPU seconds a step (every thread: the step's, torch's, the links'); None: not measured
    cpu_s_per_step: float | None = None
    # timed: the mean step's relative standard error (device_timing.relative_error); None: too few steps to say
    relative_error: float | None = None


FORK_REQUESTS, FORK_REPLIES = MessageSet(Fork), MessageSet(Forked, ForkFailed, Exited)
SESSION_REQUESTS, SESSION_REPLIES = MessageSet(Session), MessageSet(SessionFree)
CALIBRATION_REQUESTS, CALIBRATION_REPLIES = MessageSet(Go), MessageSet(Timed)


def line_of(msg: Any) -> str:
    """``msg`` as one line (newline included)."""
    return json.dumps(encode(msg)) + "\n"


def write_line(stream: IO[str], msg: Any) -> None:
    """Write ``msg`` to a text stream as one line and flush it."""
    stream.write(line_of(msg))
    stream.flush()


def read_line(line: str | bytes, messages: MessageSet) -> Any:
    """The message on ``line``: one of ``messages``, checked (else :class:`~ecofl.net.schema.MalformedMessage`)."""
    try:
        header = json.loads(line)
    except ValueError:
        raise MalformedMessage(f"not a message: {line[:80]!r}") from None
    return messages.decode(header)
