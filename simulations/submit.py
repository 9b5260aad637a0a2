"""Run one experiment on Flower's Simulation Runtime and follow it: its log, its progress bar, Ctrl-C, its end.

:func:`run_on_superlink` writes the experiment into the output directory,
starts a :class:`~simulations.local_superlink.LocalSuperLink`, submits the
project as a run (``flwr run``) whose ServerApp reads the experiment from
that file (``server/run_files.py``), and follows it until the ServerApp
writes its status: the run's log lines (``flwr log --stream``) on the
terminal, each repeated message once and Flower's own chatter left out, and
all of them in ``flower.log``; a progress bar drawn from the ServerApp's
``progress.json``. A first Ctrl-C asks the ServerApp to stop (``STOP``): it
writes the updates applied so far and ends; a second aborts, and the
SuperLink and everything it started are stopped either way.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tqdm import tqdm

from ecofl.errors import UserError
from ecofl.fl.progress import Progress, show_from
from ecofl.fl.transport import RunStopped
from server.config import Experiment, SimulationSettings
from server.run_files import RunFiles
from server.server_app import EXPERIMENT_FILE
from simulations.local_superlink import LocalSuperLink

#: Lines of Flower's that say nothing about this run (the terminal leaves them out; flower.log keeps them).
FLOWER_CHATTER = re.compile(
    r"logstream for run_id|Starting Flower Simulation|default simulated SuperNodes changed|Federation `@|"
    r"To change federation size|flwr federation simulation-config|Successfully installed|Using SuperLink|^\s*$|"
    r"INFO\s*(\x1b\[0m)?:\s*$|Manually terminating ClientAppActor"
)
_DIGITS = re.compile(r"\d+")


def federation_config(homes: int, simulation: SimulationSettings) -> dict[str, object]:
    """``flwr run --federation-config``: the simulated homes and the actors' resources (Ray's address, which the
    federation config cannot name, goes in the SuperLink's environment)."""
    backend = simulation.backend_config()
    config: dict[str, object] = {"num-supernodes": homes}
    for key, value in backend["client_resources"].items():  # a whole number as an integer: Flower counts some
        config[f"client-resources-{key.replace('_', '-')}"] = int(value) if float(value).is_integer() else value
    for key in ("num_cpus", "num_gpus"):
        if key in backend["init_args"]:
            config[f"init-args-{key.replace('_', '-')}"] = int(backend["init_args"][key])
    return config


class LogForwarder:
    """Copies a run's log stream to ``log_file`` and to the terminal (above the progress bar), without Flower's
    chatter and with each warning, error and traceback line shown once (hundreds of homes fail alike)."""

    def __init__(self, stream: subprocess.Popen, log_file: Path) -> None:
        self.stream = stream
        self.log_file = log_file
        self.seen: set[str] = set()
        self.hidden = 0
        self.thread = threading.Thread(target=self._forward, daemon=True)
        self.thread.start()

    def _forward(self) -> None:
        with self.log_file.open("a") as copy:
            for line in self.stream.stdout:
                copy.write(line)
                copy.flush()
                text = line.rstrip("\n")
                if FLOWER_CHATTER.search(text):
                    continue
                key = _DIGITS.sub("#", text.split("] - ", 1)[-1])
                if "][INFO] - " not in text and key in self.seen:  # a warning, an error, a traceback's line
                    self.hidden += 1
                    continue
                self.seen.add(key)
                tqdm.write(text, file=sys.stderr)

    @property
    def ended(self) -> bool:
        return not self.thread.is_alive()

    def close(self, drain_s: float = 20.0) -> None:
        """Let the stream deliver its last lines (it ends with the run) for up to ``drain_s``, then stop it."""
        self.thread.join(timeout=drain_s)
        if self.stream.poll() is None:
            self.stream.terminate()
        self.thread.join(timeout=10)
        if self.hidden:
            tqdm.write(f"({self.hidden} repeated log lines not shown; all in {self.log_file})", file=sys.stderr)


def run_on_superlink(exp: Experiment, simulation: SimulationSettings, progress: bool, stop: threading.Event) -> None:
    """Run ``exp`` (its ``out_dir`` set) on a SuperLink of its own with the actors of ``simulation``; returns when
    the ServerApp has ended. A failed run is a UserError with the ServerApp's one line; a stopped one RunStopped."""
    out_dir = Path(exp.out_dir)
    files = RunFiles(out_dir)
    files.clear()
    files.experiment.write_text(exp.to_json())
    with tempfile.TemporaryDirectory(prefix="ecofl-flower-") as home, \
            LocalSuperLink(Path(home), simulation.address or "local") as superlink:
        run_id = superlink.submit({EXPERIMENT_FILE: str(files.experiment)},
                                  federation_config(exp.setup.num_homes, simulation))
        forwarder = LogForwarder(superlink.follow_log(run_id), out_dir / "flower.log")
        bar = Progress(exp.loop, 0, 0.0, enabled=progress)
        try:
            while files.status() is None:
                if stop.is_set() and not files.stop.exists():
                    files.stop.touch()
                show_from(bar, files.progress)
                # the ServerApp writes its status before its run is finished: read it only once the run is
                if forwarder.ended and superlink.status(run_id).startswith("finished") and files.status() is None:
                    raise UserError(f"the run ended ({superlink.status(run_id)}) without its ServerApp's result; "
                                    f"its log: {out_dir / 'flower.log'}")
                time.sleep(0.25)
            show_from(bar, files.progress)
        finally:
            bar.close(reached_time_limit=exp.loop.max_virtual_time_s is not None)
            forwarder.close()
    status = files.status()
    if status["state"] == "failed":
        raise UserError(status["error"])
    if status["state"] == "stopped":
        raise RunStopped("stopped while connecting to the homes")
