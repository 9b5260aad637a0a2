"""Flower ServerApp: Eco-FL's event loop over Flower's Grid (Eco-FL §5; docs/architecture.md).

The ServerApp connects to the homes (a query round that maps partition ids
to Flower node ids and profiles every home), then hands the
:class:`~ecofl.fl.loop.EventLoop` a :class:`~server.grid_transport.GridTransport`:
grouping, the groups' synchronous FedProx rounds, FedAsync mixing into the
global model in virtual-time order, re-grouping, checkpoints and metrics all
live in the Flower-free loop. The server evaluates the global model on the
test split (or a seeded subset of ``eval_samples`` of it).

Two ways in:

* ``app`` (``flwr run .``): settings from ``[tool.flwr.app.config]`` via
  :func:`server.config.experiment_from_run_config`; outputs in ``out_dir``.
  A run ``simulations.run`` submitted names its experiment file instead
  (:func:`run_submitted`, ``server/run_files.py``).
* :func:`make_server_app` (``benchmarks/server.py``, which times Flower's own
  FedAvg beside the loop in one ``run_simulation``): settings and the output
  directory passed in, since ``run_simulation`` has no run config.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ecofl.batched_training import batching_obstacle
from ecofl.data import CONFIG_OPTIONS, load_dataset
from ecofl.fl.checkpoint import GLOBAL_MODEL
from ecofl.fl.clock import VirtualClock, WallClock
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.latency import make_latency_model
from ecofl.fl.loop import EventLoop, resume_loop
from ecofl.fl.metrics import write_json
from ecofl.models import build_model
from ecofl.weights import save_weights
from ecofl.errors import UserError
from ecofl.fl.transport import RunStopped
from server.config import Experiment, experiment_from_run_config, with_pipeline_rounds
from server.run_files import RunFiles, StopFile
from server.evaluation import GlobalEvaluator
from server.grid_transport import GridTransport
from server.linkstate_index import index_messages_by_node

log = logging.getLogger(__name__)

DEFAULT_OUT_DIR = "outputs/flwr"
#: The run config key naming the experiment file of a run ``simulations.run`` submitted.
EXPERIMENT_FILE = "experiment_file"


def run_server(
    grid: Grid, exp: Experiment, out_dir: Path, progress: bool | Path = True, stop: threading.Event | None = None,
    started_at: float | None = None,
) -> list[dict]:
    """Connect to the homes and run (or resume) the event loop; returns its per-update metrics.

    Setting ``stop`` ends the run at the next wait for homes, with what was
    applied so far written out. ``timing.json`` says where the wall time went
    (:func:`write_timing`), counted from ``started_at`` (``time.monotonic()``;
    default: now).
    """
    started_at = time.monotonic() if started_at is None else started_at
    index_messages_by_node()  # Flower's in-memory state, fit for many homes (server/linkstate_index.py)
    out_dir.mkdir(parents=True, exist_ok=True)
    exp = with_pipeline_rounds(exp)
    evaluator = GlobalEvaluator(exp)
    transport = GridTransport(
        grid, exp.setup.to_json(), exp.setup.num_homes,
        query_timeout_s=exp.server.query_timeout_s, reply_timeout_s=exp.server.reply_timeout_s,
        window=exp.server.messages_in_flight, silent_homes=exp.server.silent_homes,
        train_config=exp.loop.train, stop=stop, batch_homes=sends_batches(exp),
        failures=HomeFailures(out_dir / "home_failures.log"), train_in_background=exp.server.train_in_background,
    )
    placement = transport.times.placement
    try:
        transport.connect(exp.server.connect_timeout_s)
        # the homes' latency model (virtual clock): the server foresees each round's completion with it (and the
        # rounds in flight train in the background: docs/simulation.md)
        latency_model = make_latency_model(exp.setup.latency) if exp.setup.latency else None
        if exp.resume:
            loop = resume_loop(exp.resume, transport, evaluator, out_dir=out_dir, progress=progress,
                               placement=placement, failures=transport.failures, latency_model=latency_model)
        else:
            clock = VirtualClock() if exp.setup.latency else WallClock()
            loop = EventLoop(
                exp.loop, transport, range(exp.setup.num_homes), evaluator.initial_weights(), evaluator,
                clock=clock, out_dir=out_dir, progress=progress, placement=placement, failures=transport.failures,
                latency_model=latency_model,
            )
        records = loop.run()
        save_weights(out_dir / GLOBAL_MODEL, loop.global_weights)  # for `ecofl home infer --checkpoint OUT_DIR`
    finally:
        write_timing(out_dir, started_at, transport, evaluator)
    log.info("%d global updates; metrics and the global model in %s", len(records), out_dir)
    return records


def sends_batches(exp: Experiment) -> bool:
    """Whether training messages name their dispatch batches: ``batch_homes`` not off, and a model that can be
    batched exactly (else the run says once that its homes train one at a time)."""
    if exp.setup.batch_homes == "off":
        return False
    dataset = load_dataset(**exp.setup.dataset, options=CONFIG_OPTIONS)
    model = build_model(exp.setup.model["name"], dataset.input_shape, dataset.num_classes,
                        **(exp.setup.model.get("options") or {}))
    obstacle = batching_obstacle(model)
    if obstacle is not None:
        log.warning("simulation.batch_homes=%s: %s cannot be trained batched exactly (%s); homes train one at a "
                    "time", exp.setup.batch_homes, exp.setup.model["name"], obstacle)
    return obstacle is None


def write_timing(out_dir: Path, started_at: float, transport: GridTransport, evaluator: GlobalEvaluator) -> None:
    """``timing.json``: wall seconds from ``started_at`` to the first training round sent (start-up) and
    to the end, the connect phase, evaluation, the transport's times and the homes' own training times."""
    now = time.monotonic()
    times = transport.times
    first = times.first_train_at
    write_json(out_dir / "timing.json", {
        "wall_s": now - started_at,
        "startup_s": None if first is None else first - started_at,
        "evaluation_s": evaluator.seconds,
        "train_in_background": transport.trains_in_background,
        **times.to_json(),
    })


def make_server_app(
    exp: Experiment, out_dir: Path, progress: bool = True, stop: threading.Event | None = None,
    started_at: float | None = None,
) -> ServerApp:
    """A ServerApp that runs ``exp`` and writes to ``out_dir`` (for ``run_simulation``); ``stop`` ends it early;
    ``timing.json`` counts from ``started_at``."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, exp, out_dir, progress, stop, started_at)

    return server_app


app = ServerApp()


def measured_latency(run_config: Mapping) -> dict:
    """The run config with ``latency.kind = "measured"`` read as no latency model (the wall clock).

    ``conf/latency/measured.yaml`` is an empty section, which a flat run config
    cannot spell; ``"measured"`` drops every ``latency.*`` key, so homes report
    the time they measured and the loop runs on the wall clock (deployment).
    """
    if run_config.get("latency.kind") != "measured":
        return dict(run_config)
    return {key: value for key, value in run_config.items() if not key.startswith("latency.")}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """``flwr run``: the experiment comes whole from the file ``simulations.run`` wrote (the run config's
    ``experiment_file``), else from the run config."""
    run_config = dict(context.run_config)
    experiment_file = str(run_config.pop(EXPERIMENT_FILE, "") or "")
    if experiment_file:
        run_submitted(grid, Experiment.from_json(Path(experiment_file).read_text()))
        return
    exp = experiment_from_run_config(measured_latency(run_config))
    run_server(grid, exp, Path(exp.out_dir or DEFAULT_OUT_DIR).resolve(), progress=False)


def run_submitted(grid: Grid, exp: Experiment) -> None:
    """A run ``simulations.run`` submitted: its progress, stop request and end in the output directory
    (:mod:`server.run_files`), its log lines on stdout (which ``flwr log`` streams back)."""
    out_dir = Path(exp.out_dir)
    files = RunFiles(out_dir)
    _log_to_stdout()
    try:
        run_server(grid, exp, out_dir, progress=files.progress, stop=StopFile(files.stop))
    except RunStopped:
        files.write_status("stopped")
        return
    except UserError as err:  # said in one line by simulations.run
        files.write_status("failed", str(err))
        return
    except BaseException as err:
        files.write_status("failed", f"{type(err).__name__}: {err}")
        raise
    files.write_status("done")


def _log_to_stdout() -> None:
    """This process's log records (but Flower's, which it prints itself) on stdout, as a Hydra run shows them."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    handler.addFilter(lambda record: not record.name.startswith("flwr"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # Flower's requests to its SuperLink, one a second
