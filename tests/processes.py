"""Finding the processes a test started, to check that none is left behind."""

from __future__ import annotations

import os
from pathlib import Path

from ecofl.pipeline.runtime.worker_environment import PORTAL_PID_ENV
from ecofl.pipeline.runtime.worker_forks import WORKER_NAME


def worker_processes(portal: int | None = None) -> list[int]:
    """Pids of live pipeline workers that ``portal`` (default: this process) started, also once orphaned.

    A portal's workers are forked by its fork server, whose environment names
    the portal (``ECOFL_PORTAL_PID``), and carry the process name
    ``ecofl-deviceN``; a worker started as a program has the worker module on
    its command line.
    """
    portal = os.getpid() if portal is None else portal
    marker = f"{PORTAL_PID_ENV}={portal}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (entry / "environ").read_bytes().split(b"\0")
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        is_worker = comm.startswith(WORKER_NAME) or b"-m\0ecofl.pipeline.runtime.worker\0" in cmdline
        if state != "Z" and marker in environ and is_worker:
            pids.append(int(entry.name))
    return pids


def processes_matching(*needles: str) -> list[str]:
    """Command lines of running processes that contain any of ``needles``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and any(needle in cmdline for needle in needles):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def fork_servers(portal: int) -> list[int]:
    """Pids of live worker fork servers that ``portal`` started (:mod:`ecofl.pipeline.runtime.worker_forks`)."""
    marker = f"{PORTAL_PID_ENV}={portal}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            found = entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0") \
                and b"worker_forks import serve" in (entry / "cmdline").read_bytes() \
                and not (entry / "comm").read_text().startswith(WORKER_NAME)  # its children share its cmdline
        except OSError:
            continue
        if found:
            pids.append(int(entry.name))
    return pids
