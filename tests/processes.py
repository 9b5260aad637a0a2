"""Finding the processes a test started, to check that none is left behind."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ecofl.pipeline.runtime.worker_environment import PORTAL_PID_ENV
from ecofl.pipeline.runtime.worker_forks import WORKER_NAME


@dataclass(frozen=True)
class Process:
    pid: int
    comm: str  # the process name (a forked worker sets its own)
    cmdline: bytes  # NUL-separated
    environ: tuple[bytes, ...]  # its environment when it was started (a forked child: its fork server's)


def live_processes() -> Iterator[Process]:
    """Every process of this machine that has not exited (zombies left out) and whose files are readable."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            yield Process(int(entry.name), (entry / "comm").read_text().strip(), (entry / "cmdline").read_bytes(),
                          tuple((entry / "environ").read_bytes().split(b"\0")))
        except (OSError, IndexError):
            continue  # exited while being read


def _started_by(process: Process, portal: int) -> bool:
    return f"{PORTAL_PID_ENV}={portal}".encode() in process.environ


def worker_processes(portal: int | None = None) -> list[int]:
    """Pids of live pipeline workers that ``portal`` (default: this process) started, also once orphaned.

    A portal's workers are forked by its fork server, whose environment names
    the portal (``ECOFL_PORTAL_PID``), and carry the process name
    ``ecofl-deviceN``; a worker started as a program has the worker module on
    its command line.
    """
    portal = os.getpid() if portal is None else portal
    return [p.pid for p in live_processes() if _started_by(p, portal) and (
        p.comm.startswith(WORKER_NAME) or b"-m\0ecofl.pipeline.runtime.worker\0" in p.cmdline)]


def fork_servers(portal: int) -> list[int]:
    """Pids of live worker fork servers that ``portal`` started (:mod:`ecofl.pipeline.runtime.worker_forks`)."""
    return [p.pid for p in live_processes() if _started_by(p, portal) and b"worker_forks import serve" in p.cmdline
            and not p.comm.startswith(WORKER_NAME)]  # its children share its command line


def processes_matching(*needles: str) -> list[str]:
    """Command lines of running processes that contain any of ``needles``."""
    found = []
    for process in live_processes():
        cmdline = process.cmdline.replace(b"\0", b" ").decode(errors="replace")
        if any(needle in cmdline for needle in needles):
            found.append(f"{process.pid}: {cmdline[:200]}")
    return found
