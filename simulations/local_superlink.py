"""A Flower SuperLink of one simulation's own: Flower's Simulation Runtime, the way ``flwr run`` runs an app.

Flower runs a simulation as a *run* on a SuperLink started with
``--simulation``: ``flwr run`` packages the app (``pyproject.toml``'s
``[tool.flwr.app]``) and submits it; the SuperLink starts the ServerApp and
``flwr-simulation`` (which starts Ray and the ClientApps) in processes of
their own. :class:`LocalSuperLink` starts such a SuperLink on one free
loopback port (its HTTP API: runtime, control and fleet), in a session of
its own with a marker in its environment that every process it starts
inherits (Ray's workers included, even those Ray leaves orphaned), keeps
Flower's state in a folder of its own (``FLWR_HOME``), and on exit, also
on failure or Ctrl-C, stops every process that carries the marker. Its
methods are the ``flwr`` command's: submit a run, follow its log, ask its
status, stop it.

The environment the SuperLink gets: ``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION``
(use this environment; otherwise Flower builds one per run and downloads
torch), ``RAY_ADDRESS`` (``local``: a private Ray instance; or a running
cluster's address, which Flower's run config cannot name), and a filter for
Ray's FutureWarning that it will stop hiding GPUs from actors that reserve
none (the present behaviour is the one ``SimulationSettings.actor_layout``
relies on).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path

from ecofl.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
#: Every process a LocalSuperLink starts carries ``MARKER=<its token>`` in its environment.
MARKER = "ECOFL_LOCAL_SUPERLINK"
BIN = Path(sys.executable).parent


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def marked_processes(token: str | None = None, driver: int | None = None) -> list[int]:
    """The pids of the live processes whose environment carries ``MARKER=token``, or any SuperLink's marker
    that the process ``driver`` started (tokens begin with its pid), or (neither given) any marker."""
    if token:
        wanted = f"{MARKER}={token}".encode()
    else:
        wanted = f"{MARKER}={'' if driver is None else f'{driver}-'}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                variables = (entry / "environ").read_bytes().split(b"\0")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # gone, or not ours to read
            if state != "Z" and any(v == wanted if token else v.startswith(wanted) for v in variables):
                found.append(int(entry.name))
    return found


def stop_marked(token: str, grace_s: float = 10.0) -> None:
    """SIGTERM every process carrying ``token``, then SIGKILL what is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in marked_processes(token):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while marked_processes(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marked_processes(token):
            return


class LocalSuperLink:
    """A SuperLink in simulation mode on loopback, stopped with everything it started (module docstring)."""

    def __init__(self, home: Path, ray_address: str = "local", startup_timeout_s: float = 60.0) -> None:
        self.home = Path(home)
        self.port = free_loopback_port()
        self.token = f"{os.getpid()}-{uuid.uuid4().hex}"  # whose it is, and which
        self.startup_timeout_s = startup_timeout_s
        self.env = {
            **os.environ, MARKER: self.token, "FLWR_HOME": str(self.home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "RAY_ADDRESS": ray_address,
            "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.port), "FLWR_LOCAL_CONTROL_API_PORT": str(self.port),
            "PYTHONWARNINGS": "ignore:Tip:FutureWarning",  # Ray's "Tip: In future versions of Ray, ..." (docstring)
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LocalSuperLink:
        self.home.mkdir(parents=True, exist_ok=True)
        log = self.home / "superlink.log"
        self.process = subprocess.Popen(
            [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
             "--disable-runtime-dependency-installation", "--host", "127.0.0.1", "--port", str(self.port),
             "--database", str(self.home / "state.db")],
            env=self.env, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        try:
            self._wait_until_up(log)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the SuperLink and every process it started (the ServerApp, flwr-simulation, Ray)."""
        stop_marked(self.token)

    def _wait_until_up(self, log: Path) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UserError(f"flower-superlink exited with status {self.process.returncode}; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise UserError(f"flower-superlink did not answer on 127.0.0.1:{self.port} in {self.startup_timeout_s:g} s; "
                        f"see {log}")

    def flwr(self, *args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
        """The ``flwr`` command, talking to this SuperLink."""
        return subprocess.run([str(BIN / "flwr"), *args], env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout_s)

    def submit(self, run_config: Mapping[str, object], federation_config: Mapping[str, object]) -> str:
        """``flwr run`` this project with the run config's and the federation's overrides; the run's id."""
        done = self.flwr("run", str(ROOT), "local", "--format", "json", *_options("--run-config", run_config),
                         *_options("--federation-config", federation_config))
        try:
            reply = json.loads(done.stdout[done.stdout.index("{"):])
        except ValueError:
            reply = {}
        if done.returncode != 0 or not reply.get("success"):
            raise UserError(f"flwr run failed: {(done.stdout + done.stderr).strip()[-2000:]}")
        return str(reply["run-id"])

    def follow_log(self, run_id: str) -> subprocess.Popen:
        """``flwr log RUN --stream``: the run's output as it comes (ServerApp and simulation), on its stdout."""
        return subprocess.Popen([str(BIN / "flwr"), "log", run_id, "local", "--stream"], env=self.env, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def status(self, run_id: str) -> str:
        """The run's status as the SuperLink says it (``running``, ``finished:completed``, ``finished:failed``, ...)."""
        done = self.flwr("ls", "local", "--run-id", run_id, "--format", "json", timeout_s=60.0)
        try:
            runs = json.loads(done.stdout[done.stdout.index("{"):]).get("runs", [])
        except ValueError:
            runs = []
        return str(runs[0]["status"]) if runs else "unknown"

    def stop(self, run_id: str) -> None:
        self.flwr("stop", run_id, "local", timeout_s=60.0)


def _options(flag: str, values: Mapping[str, object]) -> list[str]:
    """``flag k=v`` for each value, as the ``flwr`` command takes them (TOML: strings quoted, booleans lower case)."""
    return [part for key, value in values.items() for part in (flag, f"{key}={json.dumps(value)}")]
