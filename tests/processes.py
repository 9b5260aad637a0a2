"""Finding the processes a test started, to check that none is left behind."""

from __future__ import annotations

import os
from pathlib import Path


def worker_processes(parent: int | None = None) -> list[int]:
    """Pids of pipeline workers that are children of ``parent`` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and b"ecofl.pipeline.runtime.worker" in cmdline:
            pids.append(int(stat.parent.name))
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
