"""Starting and stopping the worker processes of the devices a portal emulates locally.

Each device is ``python -m ecofl.pipeline.runtime.worker`` in its own process
(the same program a real device runs to join a home). The home's secret
travels in the environment, never on the command line. A worker asks the
kernel to kill it when the portal process dies (``PR_SET_PDEATHSIG``), so a
killed portal leaves nothing behind either; :meth:`LocalDevices.stop` stops
and reaps every process it started. With a :class:`~.confinement.Confinement`
each worker runs in a cgroup of its own (``--emulate cgroup``), removed when
the worker is killed or stopped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time

from ecofl.pipeline.runtime.confinement import THREADS_ENV, Confinement

SECRET_ENV = "ECOFL_HOME_SECRET"  # the home's secret, hex
PORTAL_PID_ENV = "ECOFL_PORTAL_PID"  # set when the portal started the worker itself


def worker_environment(extra: dict[str, str]) -> dict[str, str]:
    """A device process's environment: this one's, one torch thread unless ``extra`` says otherwise."""
    return {**os.environ, "OMP_NUM_THREADS": "1", THREADS_ENV: "1", **extra}


class LocalDevices:
    """The worker processes of one home pipeline, by device index."""

    def __init__(self, confinement: Confinement | None = None) -> None:
        self.confinement = confinement
        self.processes: dict[int, subprocess.Popen] = {}
        self._stderr: dict[int, tempfile._TemporaryFileWrapper] = {}

    def start(self, device: int, portal: tuple[str, int], secret: bytes, prefix: list[str] | None = None,
              extra_env: dict[str, str] | None = None) -> None:
        """Start device ``device``'s worker; ``prefix`` wraps the command (e.g. ``ip netns exec NS``)."""
        env = worker_environment({SECRET_ENV: secret.hex(), PORTAL_PID_ENV: str(os.getpid()), **(extra_env or {})})
        if self.confinement is not None:  # the cgroup is entered first: `ip netns exec` hides /sys/fs/cgroup
            entry, confined_env = self.confinement.enter(device)
            prefix, env = entry + (prefix or []), {**env, **confined_env}
        log = tempfile.NamedTemporaryFile(prefix=f"ecofl-device{device}-", suffix=".log", delete=True)
        command = [sys.executable, "-m", "ecofl.pipeline.runtime.worker",
                   "--portal", f"{portal[0]}:{portal[1]}", "--device", str(device)]
        self._stderr[device] = log
        self.processes[device] = subprocess.Popen(
            (prefix or []) + command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log
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
        deadline = time.time() + grace_s
        try:
            for process in self.processes.values():
                try:
                    process.wait(timeout=max(0.0, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    process.kill()
        finally:
            for process in self.processes.values():
                if process.poll() is None:
                    process.kill()
                process.wait()
            if self.confinement is not None:
                self.confinement.close()
            for log in self._stderr.values():
                log.close()
            self._stderr.clear()


def die_with_portal() -> None:
    """In a worker: be killed when the portal that started it dies (Linux), or exit if it already has."""
    parent = os.environ.pop(PORTAL_PID_ENV, None)
    if parent is None:
        return  # started by hand on a real device
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):
        os._exit(1)
