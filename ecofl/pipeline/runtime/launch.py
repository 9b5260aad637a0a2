"""Starting and stopping the worker processes of the devices a portal emulates locally.

Each device runs the program a real device runs to join a home
(:mod:`ecofl.pipeline.runtime.worker`), forked by this process's fork
server (:mod:`.worker_forks`: torch is imported once, not once per device).
The home's secret travels in the environment, never on a command line. A
worker dies with the fork server, and the server with the portal, so a
killed portal leaves nothing behind either; :meth:`LocalDevices.stop` stops
and reaps every worker it started. With a :class:`~.confinement.Confinement`
each worker runs in a cgroup of its own (``--emulate cgroup``), removed when
the worker is killed or stopped; with a home network, in its device's
network namespace.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

from ecofl.interrupt import interrupts_deferred
from ecofl.pipeline.runtime.confinement import Confinement
from ecofl.net.auth import SECRET_ENV
from ecofl.pipeline.runtime.worker_environment import PORTAL_PID_ENV, worker_environment
from ecofl.pipeline.runtime.worker_forks import WORKER_NAME, ForkedWorker, worker_forks


class LocalDevices:
    """The worker processes of one home pipeline, by device index."""

    def __init__(self, confinement: Confinement | None = None) -> None:
        self.confinement = confinement
        self.processes: dict[int, ForkedWorker] = {}
        self._stderr: dict[int, tempfile._TemporaryFileWrapper] = {}

    def start(self, device: int, portal: tuple[str, int], secret: bytes, namespace: str | None = None) -> None:
        """Start device ``device``'s worker, in network namespace ``namespace`` if given."""
        env = worker_environment({SECRET_ENV: secret.hex()})
        cgroup_procs: list[str] = []
        log = tempfile.NamedTemporaryFile(prefix=f"ecofl-device{device}-", suffix=".log", delete=True)
        self._stderr[device] = log
        server = worker_forks(worker_environment({PORTAL_PID_ENV: str(os.getpid())}))
        if self.confinement is not None:  # recorded in the confinement, whose close() in stop() removes it
            group, confined_env = self.confinement.enter(device)
            cgroup_procs = group.procs_files
            env.update(confined_env)
        self.processes[device] = server.fork(
            ["--portal", f"{portal[0]}:{portal[1]}", "--device", str(device)], env, log.name,
            f"{WORKER_NAME}{device}", cgroup_procs, namespace,
        )

    @property
    def pids(self) -> dict[int, int]:
        return {d: p.pid for d, p in self.processes.items()}

    def exited(self) -> dict[int, int]:
        """Devices whose process has ended, with its exit code."""
        return {d: p.returncode for d, p in self.processes.items() if p.poll() is not None}

    def log_tail(self, device: int, lines: int = 5) -> str:
        log = self._stderr.get(device)
        if log is None:
            return ""
        with open(log.name, errors="replace") as f:
            return "\n".join(f.read().strip().splitlines()[-lines:])

    def signal(self, device: int, signum: int) -> None:
        """Send ``signum`` to device ``device``'s worker (injected failures: SIGKILL, SIGSTOP)."""
        process = self.processes.get(device)
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    def kill(self, device: int) -> None:
        """Kill device ``device``'s worker (also a frozen one) and reap it; remove its cgroup."""
        process = self.processes.get(device)
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()
        if self.confinement is not None:
            self.confinement.release(device)

    def out_of_memory(self, device: int) -> bool:
        """Whether the kernel killed ``device``'s worker at its cgroup's memory limit."""
        return self.confinement is not None and self.confinement.out_of_memory(device)

    def stop(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for the workers to exit, then kill the rest; reap all; remove their cgroups.

        A second Ctrl-C while waiting ends the grace, not the clean-up: the rest are killed and reaped."""
        deadline = time.monotonic() + grace_s
        try:
            for process in self.processes.values():
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
        finally:
            with interrupts_deferred():  # a third Ctrl-C must not leave a worker or a cgroup behind
                for process in self.processes.values():
                    if process.poll() is None:
                        process.kill()
                    process.wait()
                if self.confinement is not None:
                    self.confinement.close()
                for log in self._stderr.values():
                    log.close()
                self._stderr.clear()

