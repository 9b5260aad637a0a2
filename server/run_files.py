"""The files a run shares with the ``simulations.run`` that submitted it to a SuperLink, in its output directory.

``simulations.run`` submits the run to Flower's Simulation Runtime
(``simulations/local_superlink.py``): the ServerApp runs in a process the
SuperLink starts, so the two meet in the run's output directory:

* ``experiment.json``: the whole experiment (``server.config.Experiment``);
* ``STOP``: made by a first Ctrl-C; the ServerApp's next wait for homes
  ends, and the updates applied so far are written (:class:`StopFile`);
* ``progress.json``: the loop's progress after every update
  (``ecofl.fl.progress``), drawn as a bar by ``simulations.run``;
* ``status.json``: written last: ``done``, or ``failed`` with the error in
  one line (a user error: no traceback).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ecofl.fl.metrics import write_json


@dataclass(frozen=True)
class RunFiles:
    out_dir: Path

    @property
    def experiment(self) -> Path:
        return self.out_dir / "experiment.json"

    @property
    def stop(self) -> Path:
        return self.out_dir / "STOP"

    @property
    def progress(self) -> Path:
        return self.out_dir / "progress.json"

    @property
    def status_file(self) -> Path:
        return self.out_dir / "status.json"

    def clear(self) -> None:
        """Forget an earlier run's stop request, progress and status (a run started again in its directory)."""
        for path in (self.stop, self.progress, self.status_file):
            path.unlink(missing_ok=True)

    def write_status(self, state: str, error: str | None = None) -> None:
        write_json(self.status_file, {"state": state, "error": error})

    def status(self) -> dict | None:
        """``{"state", "error"}`` once the ServerApp has ended, else None."""
        try:
            return json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return None


class StopFile:
    """A stop request as a file: what :class:`threading.Event` offers the transport (``is_set``, ``wait``)."""

    def __init__(self, path: Path, poll_s: float = 0.1) -> None:
        self.path = path
        self.poll_s = poll_s

    def is_set(self) -> bool:
        return self.path.exists()

    def set(self) -> None:
        self.path.touch()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether a stop was asked for within ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(self.poll_s if left is None else min(self.poll_s, left))
        return True
