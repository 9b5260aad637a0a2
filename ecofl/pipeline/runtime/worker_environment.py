"""The environment a device's worker process starts with, when a portal starts it on its own machine.

The home's secret travels here, never on a command line. A worker started as
a program by a portal (a device daemon's warm worker) is told the portal's
pid and dies with it; one forked by the portal's fork server
(:mod:`.worker_forks`) dies with the server, which dies with the portal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from ecofl.pipeline.runtime.confinement import THREADS_ENV

PR_SET_PDEATHSIG = 1
PORTAL_PID_ENV = "ECOFL_PORTAL_PID"  # the portal that started a worker (or the fork server that forks them)


def worker_environment(extra: dict[str, str]) -> dict[str, str]:
    """A device process's environment: this one's, one torch thread unless ``extra`` says otherwise."""
    return {**os.environ, "OMP_NUM_THREADS": "1", THREADS_ENV: "1", **extra}


def die_with_portal() -> None:
    """In a worker: be killed when the portal that started it dies (Linux), or exit if it already has."""
    parent = os.environ.pop(PORTAL_PID_ENV, None)
    if parent is not None:  # else started by hand on a real device, or forked by a fork server (which sees to it)
        die_with(int(parent))


def die_with(parent: int) -> None:
    """Be killed when ``parent`` dies (Linux's PR_SET_PDEATHSIG), or exit at once if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
