"""Hydra entry point: one Eco-FL simulation on Flower's Simulation Runtime (the way ``flwr run`` runs it).

    python -m simulations.run strategy=ecofl dataset=fashion_mnist homes=300
    python -m simulations.run +experiment=smoke
    python -m simulations.run -m strategy=ecofl,fedat,astraea
    python -m simulations.run -m +experiment=fig9 grouping.lambda=0,10,100

Each run writes ``metrics.csv``, ``metrics.json``, ``summary.json`` (final
and best accuracy, virtual time to the target accuracy, updates applied,
homes dropped), checkpoints if asked, and ``accuracy.png`` into Hydra's
output directory; a multirun also overlays its runs (``simulations.plot``).
Hydra configures, sweeps and names the runs; each run is submitted to a
SuperLink of its own in simulation mode (``simulations/submit.py``), as
Flower recommends.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from ecofl.accelerator import device_label, resolve_device
from ecofl.data import CONFIG_OPTIONS, load_dataset
from ecofl.data.partition import check_partition
from ecofl.errors import UserError
from ecofl.fl.home_failures import MOSTLY_FAILED_EXIT, mostly_failed
from ecofl.fl.stop_rules import STOPPED
from ecofl.fl.transport import RunStopped
from ecofl.interrupt import INTERRUPTED_EXIT
from server.config import Experiment, SimulationSettings, experiment
from simulations.log_flood import once_per_message
from simulations.overrides import check_overrides
from simulations.plot import plot_run
from simulations.ray_cluster import check_reachable
from simulations.submit import run_on_superlink

log = logging.getLogger(__name__)


@contextmanager
def stop_on_interrupt(stop: threading.Event) -> Iterator[None]:
    """The first Ctrl-C or SIGTERM sets ``stop`` (the run ends at its next wait for homes, outputs written); a
    second aborts (and the SuperLink with everything it started is stopped). SIGTERM's default would end the
    process at once and leave the SuperLink and Ray running (their own sessions: a ``kill`` of the run's
    session does not reach them)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        log.warning("stopping: writing the updates applied so far (Ctrl-C or SIGTERM again to abort)")

    previous = {signum: signal.signal(signum, on_interrupt) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def simulate(exp: Experiment, out_dir: Path, progress: bool = True) -> dict:
    """Run ``exp`` on Flower's Simulation Runtime (:func:`simulations.submit.run_on_superlink`); returns
    ``summary.json``.

    The device is resolved, the dataset loaded and the partition checked
    here first, and a Ray cluster to join (``simulation.address``) must
    answer, so these are clear errors before anything starts
    (``simulation.device=cuda`` without a GPU is one of them). The actors'
    resources follow from where the homes train
    (:meth:`~server.config.SimulationSettings.actor_layout`). A private Ray
    instance ends with the run's SuperLink, also when the ServerApp fails or
    is stopped by Ctrl-C (:func:`stop_on_interrupt`); a joined cluster keeps
    running.
    """
    simulation = actor_layout(exp)
    dataset = load_dataset(**exp.setup.dataset, options=CONFIG_OPTIONS)
    check_partition(len(dataset.train), exp.setup.num_homes, exp.setup.partition)
    if exp.simulation.address:
        check_reachable(exp.simulation.address)
    out_dir = out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    submitted = replace(exp, out_dir=str(out_dir), simulation=simulation)
    stop = threading.Event()
    with stop_on_interrupt(stop), once_per_message(_log_file()):
        run_on_superlink(submitted, simulation, progress, stop)
    return json.loads((out_dir / "summary.json").read_text())


def _log_file() -> str | None:
    """The file Hydra's job logging writes (None outside Hydra)."""
    files = [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    return files[0] if files else None


def discard_if_nothing_ran(out_dir: Path) -> None:
    """Remove the output directory Hydra made for a run that failed before it trained anything (no summary.json),
    so a mistyped setting leaves no empty run behind."""
    if not (out_dir / "summary.json").exists():
        shutil.rmtree(out_dir, ignore_errors=True)


def actor_layout(exp: Experiment) -> SimulationSettings:
    """The simulation's actors for the device the homes train on here (a UserError naming a missing one).

    Ray gives each actor the GPUs it reserves, and an actor sees them from
    ``cuda:0``: a simulation names no other index (``CUDA_VISIBLE_DEVICES``
    chooses the GPUs Ray may use).
    """
    spec = exp.simulation.device
    if spec.startswith("cuda:") and spec != "cuda:0":
        raise UserError(f"simulation.device={spec}: Ray gives each actor its own GPU, seen as cuda:0; use cuda "
                        f"or auto, with CUDA_VISIBLE_DEVICES={spec[5:]} to pick the GPU")
    device = resolve_device(spec, "simulation.device")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    simulation = exp.simulation.actor_layout(gpus)
    batched = exp.setup.batch_homes == "on" or (exp.setup.batch_homes == "auto" and gpus > 0)
    log.info("homes train on %s%s; %d actor(s), each with %g CPU(s) and %g GPU(s)", device_label(device),
             ", the homes of a dispatch together" if batched else "", simulation.actors,
             simulation.cpus_per_actor, simulation.gpus_per_actor)
    return simulation


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Run the configured simulation; returns the best accuracy (for Hydra sweepers)."""
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    logging.getLogger("flwr").setLevel(logging.INFO)  # Flower logs at DEBUG into Hydra's handlers otherwise
    settings = OmegaConf.to_container(cfg, resolve=True)
    try:
        exp = experiment(settings)
        summary = simulate(exp, out_dir)
    except UserError as err:
        log.error("%s", err)
        discard_if_nothing_ran(out_dir)
        sys.exit(2)
    except RunStopped:
        log.error("stopped while connecting to the homes: nothing was trained")
        sys.exit(INTERRUPTED_EXIT)
    if cfg.plot:
        plot_run(out_dir)
    log.info("summary: %s", json.dumps(summary))
    log.info("outputs in %s", out_dir)
    if summary["stop_reason"] == STOPPED:
        sys.exit(INTERRUPTED_EXIT)
    if mostly_failed(summary):
        log.error("more of the homes' training tasks failed than brought an update (home_failures in summary.json)")
        sys.exit(MOSTLY_FAILED_EXIT)
    return float(summary.get("best_accuracy") or 0.0)


if __name__ == "__main__":
    try:
        check_overrides(sys.argv[1:])
    except UserError as err:
        print(f"simulations.run: error: {err}", file=sys.stderr)
        sys.exit(2)
    main()
