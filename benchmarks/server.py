"""Server benchmarks: client updates per second of the Eco-FL event loop vs Flower's FedAvg, and memory.

    .venv/bin/python -m benchmarks.server                   # both parts, defaults below
    .venv/bin/python -m benchmarks.server --skip-memory     # throughput only

(Run as a module from the project root: a script called server.py would shadow
the ``server`` package.)

**Throughput.** One Flower simulation (one set of Ray actors, so both sides
run on the same warm clients, model and data) runs, ``--repeats`` times in
alternation: Flower's own ``flwr.serverapp.strategy.FedAvg.start`` for
``--rounds`` rounds of ``--per-round`` homes, and this project's event loop
(:class:`~ecofl.fl.loop.EventLoop` over :class:`~server.grid_transport.GridTransport`)
with the ``fedavg`` policy (the same rounds of the same size), then with the
``ecofl`` policy. Both sides skip evaluation; the clock starts after a query
round that has loaded the data into every actor. The figure is completed
client updates (trainings) per wall second, and those of them that were
applied to the global model per wall second (the event loop also trains the
rounds still in flight when it stops, whose updates are never applied).

**Memory.** A separate simulation of ``--memory-homes`` homes runs
``--memory-updates`` Eco-FL updates while a thread samples the process tree
(the driver, Ray's processes and the actors) every 0.5 s from ``/proc``:
peak total PSS (shared pages split between the processes that map them, so
the sum is real memory) and peak RSS.

Writes ``benchmarks/results/server.json`` (``--json``), prints the Markdown
tables and puts them into the measured section of ``docs/server.md`` (``--doc``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from benchmarks.markdown_section import replace_section
from benchmarks.process_tree import TreeMemory
import protocol
from client.client_app import app as client_app
from ecofl.fl.loop import EventLoop
from ecofl.fl.transport import HomeReport, TrainReply, TrainTask
from server.config import Experiment, experiment
from server.grid_transport import GridTransport
from server.evaluation import GlobalEvaluator
from server.server_app import make_server_app


class CountingTransport:
    """A transport that counts the trainings it completed (also those of rounds the loop never
    applies) and the seconds spent waiting for homes (train and query calls)."""

    def __init__(self, inner: GridTransport) -> None:
        self.inner = inner
        self.trained = 0
        self.waiting_s = 0.0

    def reset(self) -> None:
        self.trained, self.waiting_s = 0, 0.0

    def query(self, homes: Sequence[int], virtual_time: float) -> list[HomeReport]:
        started = time.perf_counter()
        reports = self.inner.query(homes, virtual_time)
        self.waiting_s += time.perf_counter() - started
        return reports

    def train(self, tasks: Sequence[TrainTask]) -> list[TrainReply]:
        started = time.perf_counter()
        replies = self.inner.train(tasks)
        self.waiting_s += time.perf_counter() - started
        self.trained += sum(reply.error is None for reply in replies)
        return replies


def throughput_app(exp: Experiment, rounds: int, per_round: int, repeats: int, results: list[dict]) -> ServerApp:
    """A ServerApp timing Flower's FedAvg and the event loop side by side; appends to ``results``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        homes = exp.setup.num_homes
        setup_json = exp.setup.to_json()
        transport = CountingTransport(GridTransport(grid, setup_json, homes))
        transport.inner.connect(exp.server.connect_timeout_s)  # every actor has loaded and partitioned the data
        initial = GlobalEvaluator(exp).initial_weights()
        train_config = protocol.config_record({**exp.loop.train, protocol.SETUP: setup_json})
        for repeat in range(repeats):
            strategy = FedAvg(fraction_train=per_round / homes, fraction_evaluate=0.0,
                              min_train_nodes=per_round, min_available_nodes=homes)
            started = time.perf_counter()
            strategy.start(grid, ArrayRecord(initial), num_rounds=rounds, train_config=train_config)
            results.append({"side": "flower FedAvg", "repeat": repeat, "updates": rounds * per_round,
                            "applied": rounds * per_round, "seconds": time.perf_counter() - started})
            for policy in ("fedavg", "ecofl"):
                config = replace(exp.loop, strategy=policy, max_concurrent=per_round,
                                 max_updates=rounds * (1 if policy == "fedavg"
                                                       else per_round // exp.loop.homes_per_round),
                                 eval_every=10**6, seed=repeat, target_accuracy=None)
                loop = EventLoop(config, transport, range(homes), initial, lambda weights: (0.0, 0.0), progress=False)
                transport.reset()
                started = time.perf_counter()
                loop.run()
                results.append({"side": f"event loop ({policy})", "repeat": repeat, "updates": transport.trained,
                                "applied": sum(row["homes"] for row in loop.state.rows),
                                "seconds": time.perf_counter() - started, "waiting_for_homes_s": transport.waiting_s})

    return app


def measure_throughput(args: argparse.Namespace) -> dict:
    exp = experiment({
        "homes": args.homes, "dataset": {"name": args.dataset}, "latency": {"kind": "paper"},
        "train": {"epochs": args.epochs, "batch_size": 10, "lr": 0.05, "mu": 0.05},
        "simulation": {"actors": args.actors},
    })
    results: list[dict] = []
    run_simulation(server_app=throughput_app(exp, args.rounds, args.per_round, args.repeats, results),
                   client_app=client_app, num_supernodes=args.homes,
                   backend_config=exp.simulation.backend_config())
    for r in results:
        r["updates_per_s"] = r["updates"] / r["seconds"]
        r["applied_per_s"] = r["applied"] / r["seconds"]
    flower = {r["repeat"]: r["updates_per_s"] for r in results if r["side"] == "flower FedAvg"}
    sides = {}
    for side in dict.fromkeys(r["side"] for r in results):
        runs = [r for r in results if r["side"] == side]
        sides[side] = {
            "updates_per_s": statistics.median(r["updates_per_s"] for r in runs),
            # each repeat against the FedAvg run just before it: the machine's load drifts between repeats
            "vs_flower": statistics.median(r["updates_per_s"] / flower[r["repeat"]] for r in runs),
            "applied_per_s": statistics.median(r["applied_per_s"] for r in runs),
            "applied_vs_flower": statistics.median(r["applied_per_s"] / flower[r["repeat"]] for r in runs),
        }
    return {"homes": args.homes, "dataset": args.dataset, "epochs": args.epochs, "rounds": args.rounds,
            "per_round": args.per_round, "repeats": args.repeats, "actors": args.actors, "sides": sides,
            "raw": results}


def measure_memory(args: argparse.Namespace, out_dir: Path) -> dict:
    exp = experiment({
        "homes": args.memory_homes, "dataset": {"name": args.dataset}, "latency": {"kind": "paper"},
        "train": {"epochs": args.epochs, "batch_size": 10, "lr": 0.05, "mu": 0.05},
        "loop": {"max_updates": args.memory_updates, "eval_every": args.memory_updates},
        "server": {"eval_samples": 1000}, "simulation": {"actors": args.actors},
    })
    started = time.perf_counter()
    with TreeMemory() as memory:
        run_simulation(server_app=make_server_app(exp, out_dir, progress=False), client_app=client_app,
                       num_supernodes=exp.setup.num_homes, backend_config=exp.simulation.backend_config())
    summary = json.loads((out_dir / "summary.json").read_text())
    return {"homes": args.memory_homes, "updates": summary["updates"], "dataset": args.dataset,
            "actors": args.actors, "seconds": time.perf_counter() - started,
            "peak_pss_mb": memory.peak_pss / 2**20, "peak_rss_mb": memory.peak_rss / 2**20,
            "processes_at_peak": [{"process": name, "pss_mb": pss / 2**20} for name, pss in memory.at_peak]}


def markdown(result: dict) -> str:
    lines = []
    if "throughput" in result:
        t = result["throughput"]
        lines += [
            f"Client updates per second, {t['homes']} homes on {t['dataset']}, {t['per_round']} homes per round, "
            f"{t['epochs']} local epoch(s), {t['actors']} Ray actors; medians over {t['repeats']} repeats, "
            "each ratio against the FedAvg run of its own repeat:",
            "",
            "| server | client updates / s | vs Flower FedAvg | applied to the model / s | vs Flower FedAvg |",
            "|---|---:|---:|---:|---:|",
            *(f"| {side} | {v['updates_per_s']:.2f} | {v['vs_flower']:.2f}x | {v['applied_per_s']:.2f} "
              f"| {v['applied_vs_flower']:.2f}x |" for side, v in t["sides"].items()),
            "",
        ]
    if "memory" in result:
        m = result["memory"]
        lines += [
            f"Peak memory of a {m['homes']}-home simulation ({m['updates']} Eco-FL updates, {m['actors']} actors, "
            f"{m['seconds']:.0f} s):",
            "",
            "| peak PSS (MB) | peak RSS sum (MB) | processes |",
            "|---:|---:|---:|",
            f"| {m['peak_pss_mb']:.0f} | {m['peak_rss_mb']:.0f} | {len(m['processes_at_peak'])} |",
            "",
            "| process (at the peak) | PSS (MB) |",
            "|---|---:|",
            *(f"| `{p['process']}` | {p['pss_mb']:.0f} |" for p in m["processes_at_peak"]),
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--homes", type=int, default=300)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--memory-homes", type=int, default=1000)
    parser.add_argument("--memory-updates", type=int, default=10)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/server.json"))
    parser.add_argument("--doc", type=Path, default=Path("docs/server.md"))
    args = parser.parse_args()
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    if not args.skip_throughput:
        result["throughput"] = measure_throughput(args)
    if not args.skip_memory:
        with tempfile.TemporaryDirectory() as out_dir:
            result["memory"] = measure_memory(args, Path(out_dir))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    if not (args.skip_memory or args.skip_throughput):  # a partial run leaves the page's figures alone
        replace_section(args.doc, table)
    print(table)


if __name__ == "__main__":
    main()
