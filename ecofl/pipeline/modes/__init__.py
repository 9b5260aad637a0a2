"""The pipeline's modes, one object each, looked up by schedule kind.

As torch.distributed.pipelining keeps one class per schedule behind a
registry (``get_schedule_class``), every mode a plan can run is a
:class:`Mode` registered here under its :class:`ScheduleKind`:

- ``"1f1b"``: 1F1B-Sync (Eco-FL §4.3), :mod:`.one_f_one_b_sync`;
- ``"gpipe"``: backward after forward (GPipe), :mod:`.gpipe`;
- ``"async-1f1b"``: PipeDream's asynchronous 1F1B as FTPipeHD runs it (§III-C), :mod:`.async_one_f_one_b`;
- ``"stream"``: pipelined inference (PipeEdge), :mod:`.stream`.

A mode owns what differs between them: its action lists, its device programs,
its worker executor, its portal driver, its part of the cost and memory models
and its compatibility rules. The planner, the cost model and the runtime ask
``mode_of(plan)`` and never compare schedule kinds themselves.
"""

from __future__ import annotations

from typing import Any

from ecofl.pipeline.modes.async_one_f_one_b import AsyncOneFOneB
from ecofl.pipeline.modes.base import Mode
from ecofl.pipeline.modes.gpipe import GPipe
from ecofl.pipeline.modes.one_f_one_b_sync import OneFOneBSync
from ecofl.pipeline.modes.stream import Stream
from ecofl.pipeline.schedule import ScheduleKind

MODES: dict[ScheduleKind, Mode] = {}


def register_mode(mode: Mode) -> Mode:
    """Make ``mode`` the one its kind names (a new mode registers itself the same way)."""
    MODES[mode.kind] = mode
    return mode


for _mode in (OneFOneBSync(), GPipe(), AsyncOneFOneB(), Stream()):
    register_mode(_mode)


def mode_of(what: Any) -> Mode:
    """The mode of a plan or a worker's role (their ``schedule``), or of a kind or its string form; ValueError
    naming the valid kinds for an unknown one."""
    return MODES[ScheduleKind.from_str(getattr(what, "schedule", what))]


__all__ = ["MODES", "Mode", "mode_of", "register_mode"]
