"""Warm pipeline workers: processes that start before a session needs them and serve session after session.

A device daemon (:mod:`.device_daemon`) hands each pipeline session the home
service asks for to one of these, and the home service does the same for the
portal's own stage: starting Python and torch takes seconds, which a round
should not wait for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from ecofl.net.auth import SECRET_ENV
from ecofl.pipeline.runtime.pipe_messages import SESSION_REPLIES, Session, SessionFree, read_line, write_line
from ecofl.pipeline.runtime.worker_environment import PORTAL_PID_ENV


class WarmWorkers:
    """Pipeline worker processes that start before they are needed and serve session after session.

    Each worker is ``starting`` (importing), ``idle`` or ``busy``. A session
    goes to an idle worker, else to one still starting (the session waits in
    its input), else to a new one (two sessions at once). A worker says
    ``ready`` when started and ``done`` after each session, and serves the
    next one; one that exits (its session failed) is replaced. No spare is
    started while a session runs: on a small device it would take the CPU
    from the round. A worker of an abandoned session gives up on its own when
    its portal never answers.
    """

    def __init__(self, secret: bytes, spares: int = 1, prefix: list[str] | None = None):
        self.secret, self.spares, self.prefix = secret, spares, prefix or []  # prefix: e.g. a cgroup's entry
        self._state: dict[subprocess.Popen, str] = {}
        self._lock = threading.Lock()
        self._stopped = False

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, SECRET_ENV: self.secret.hex(), PORTAL_PID_ENV: str(os.getpid()),
               "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen([*self.prefix, sys.executable, "-m", "ecofl.pipeline.runtime.worker", "--sessions"],
                                   env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._state[process] = "starting"
        threading.Thread(target=self._follow, args=(process,), daemon=True).start()
        return process

    def _follow(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            if not isinstance(read_line(line, SESSION_REPLIES), SessionFree):
                continue
            with self._lock:
                if self._state.get(process) in ("starting", "busy"):
                    self._state[process] = "idle"
        process.wait()
        with self._lock:
            self._state.pop(process, None)
        self.warm()  # replace it

    def warm(self) -> None:
        """Start workers until ``spares`` are idle or starting."""
        with self._lock:
            spare = sum(state != "busy" for state in self._state.values())
            for _ in range(0 if self._stopped else self.spares - spare):
                self._start()

    def run(self, session: Session) -> None:
        """Hand ``session`` to the readiest worker, or to a new one."""
        while True:
            with self._lock:
                ranked = sorted((p for p, state in self._state.items() if state != "busy" and p.poll() is None),
                                key=lambda p: self._state[p] != "idle")
                process = ranked[0] if ranked else self._start()
                self._state[process] = "busy"
            try:
                write_line(process.stdin, session)
                break
            except OSError:  # it died just now: try the next
                with self._lock:
                    self._state.pop(process, None)

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every worker: SIGTERM, then SIGKILL after ``grace_s``."""
        with self._lock:
            self._stopped = True
            workers = list(self._state)
            self._state.clear()
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
