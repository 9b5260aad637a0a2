"""Where a simulated global update's wall time goes, against training the same homes in one process.

    .venv/bin/python -m benchmarks.update_time                 # 300 homes, 10 Eco-FL updates, 1 local epoch
    .venv/bin/python -m benchmarks.update_time --homes 1000 --updates 20

Two runs of one experiment, one after the other (the machine is shared:
their ratio is the figure to read):

1. **Flower**: :func:`simulations.run.simulate` (Ray actors, the real
   ClientApp; ``server.train_in_background`` off, so every dispatch waits
   for its replies). From its ``timing.json``, per global update after start-up:
   the wall time; the time the server waited in ``Transport.train`` (the
   homes' training plus Flower/Ray transport); the homes' own training
   seconds (each ClientApp times ``train_local``; summed, and divided by the
   actors as the best parallel case); evaluation of the global model; and
   the rest, the server loop (dispatch, aggregation, metrics, re-grouping).
2. **Floor**: the same :class:`~ecofl.fl.loop.EventLoop` over
   :class:`~ecofl.fl.inprocess.InProcessTransport`, which trains the same
   tasks on the same homes in this one process (the loop's metrics are
   Flower's, ``tests/test_simulation.py``), timed the same way.

Writes ``benchmarks/results/update_time.json`` and the table into
``docs/update_time.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks.markdown_section import replace_section
from client.federation import federation
from ecofl.fl.inprocess import InProcessTransport
from ecofl.fl.loop import EventLoop
from server.config import experiment
from server.evaluation import GlobalEvaluator
from simulations.run import simulate

ROOT = Path(__file__).resolve().parents[1]


class TimedTransport(InProcessTransport):
    """The in-process transport, timing its ``train`` calls."""

    train_s = 0.0

    def train(self, tasks):
        started = time.perf_counter()
        try:
            return super().train(tasks)
        finally:
            self.train_s += time.perf_counter() - started


def flower_run(settings: dict, out_dir: Path) -> dict:
    summary = simulate(experiment(settings), out_dir, progress=False)
    timing = json.loads((out_dir / "timing.json").read_text())
    updates = summary["updates"]
    after = timing["wall_s"] - timing["startup_s"]
    actors = settings["simulation"]["actors"]
    return {
        "updates": updates, "client_updates": timing["train_replies"], "startup_s": timing["startup_s"],
        "wall_per_update_s": after / updates,
        "waiting_for_homes_per_update_s": timing["train_wall_s"] / updates,
        "home_training_per_update_s": timing["home_train_s"] / updates,
        "home_training_parallel_per_update_s": timing["home_train_s"] / actors / updates,
        "evaluation_per_update_s": timing["evaluation_s"] / updates,
        "server_loop_per_update_s": (after - timing["train_wall_s"] - timing["evaluation_s"]) / updates,
    }


def floor_run(settings: dict) -> dict:
    exp = experiment(settings)
    fed = federation(exp.setup.to_json())
    transport = TimedTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts, fed.latency_model,
                               num_classes=fed.dataset.num_classes)
    evaluator = GlobalEvaluator(exp)
    loop = EventLoop(exp.loop, transport, range(exp.setup.num_homes), evaluator.initial_weights(), evaluator,
                     progress=False)
    started = time.perf_counter()
    rows = loop.run()
    wall = time.perf_counter() - started
    updates = len(rows)
    return {
        "updates": updates, "client_updates": transport.tasks_run, "wall_per_update_s": wall / updates,
        "home_training_per_update_s": transport.train_s / updates,
        "evaluation_per_update_s": evaluator.seconds / updates,
        "server_loop_per_update_s": (wall - transport.train_s - evaluator.seconds) / updates,
    }


def markdown(result: dict) -> str:
    f, o = result["flower"], result["floor"]
    s = result["settings"]
    return "\n".join([
        f"{s['homes']} homes on {s['dataset']['name']}, Eco-FL, {f['updates']} global updates of 1 local epoch, "
        f"{s['simulation']['actors']} Ray actors; measured {result['date']}, load average "
        f"{result['load_before']:.1f} before and {result['load_after']:.1f} after (2 cores, shared). "
        "Seconds per global update after start-up:",
        "",
        "| | Flower simulation | one process (floor) | Flower / floor |",
        "|---|---:|---:|---:|",
        f"| wall time | {f['wall_per_update_s']:.2f} | {o['wall_per_update_s']:.2f} | "
        f"{f['wall_per_update_s'] / o['wall_per_update_s']:.2f}x |",
        f"| waiting for the homes (training + Flower/Ray transport) | {f['waiting_for_homes_per_update_s']:.2f} | "
        f"{o['home_training_per_update_s']:.2f} | "
        f"{f['waiting_for_homes_per_update_s'] / o['home_training_per_update_s']:.2f}x |",
        f"| of it: home training, as the homes timed it (sum) | {f['home_training_per_update_s']:.2f} | "
        f"{o['home_training_per_update_s']:.2f} | "
        f"{f['home_training_per_update_s'] / o['home_training_per_update_s']:.2f}x |",
        f"| of it: home training on {s['simulation']['actors']} actors in parallel (sum / actors) | "
        f"{f['home_training_parallel_per_update_s']:.2f} | | |",
        f"| of it: Flower/Ray transport and scheduling (waiting - parallel training) | "
        f"{f['waiting_for_homes_per_update_s'] - f['home_training_parallel_per_update_s']:.2f} | | |",
        f"| evaluation (global model, {s['server']['eval_samples']} test images) | "
        f"{f['evaluation_per_update_s']:.2f} | "
        f"{o['evaluation_per_update_s']:.2f} | |",
        f"| server loop (dispatch, aggregation, metrics, re-grouping) | {f['server_loop_per_update_s']:.2f} | "
        f"{o['server_loop_per_update_s']:.2f} | |",
        "",
        f"Client updates: {f['client_updates']} (Flower, including rounds still in flight at the end), "
        f"{o['client_updates']} (floor). Start-up of the Flower run: {f['startup_s']:.1f} s.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--homes", type=int, default=300)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/update_time.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs/update_time.md")
    args = parser.parse_args()
    settings = {
        "homes": args.homes, "dataset": {"name": "fashion_mnist"}, "latency": {"kind": "paper"},
        "train": {"epochs": 1, "batch_size": 10, "lr": 0.05, "mu": 0.05},
        # every dispatch waits for its replies, as the floor's loop does, so waiting and the loop's own time
        # separate (in the background they overlap: benchmarks/rounds_in_flight.py measures that)
        "loop": {"max_updates": args.updates, "target_accuracy": None},
        "server": {"eval_samples": 2000, "train_in_background": False},
        "simulation": {"actors": args.actors},
    }
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        flower = flower_run(settings, Path(tmp))
    floor = floor_run(settings)
    result = {"date": time.strftime("%Y-%m-%d"), "settings": settings, "flower": flower, "floor": floor,
              "load_before": load_before, "load_after": os.getloadavg()[0]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    replace_section(args.doc, table)
    print(table)


if __name__ == "__main__":
    main()
