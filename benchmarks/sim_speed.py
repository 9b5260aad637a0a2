"""How fast simulated homes train: one at a time on CPU threads, on a GPU, and a dispatch's homes batched.

    .venv/bin/python -m benchmarks.sim_speed homes                 # home trainings per second, every mode here
    .venv/bin/python -m benchmarks.sim_speed fig7 --engine flower  # a whole Fig. 7 Eco-FL run through Flower
    .venv/bin/python -m benchmarks.sim_speed fig7 --engine in-process --device cuda --batch-homes on
    .venv/bin/python -m benchmarks.sim_speed table                 # re-draw docs/sim_speed.md and its plot

``homes`` trains the homes of a Fig. 7 federation (Fashion-MNIST, 300
homes of 200 samples, the FedAvg CNN, 3 epochs of batch 10, FedProx mu 0.05,
lr 0.05) in every mode this machine has, side by side in one process:
one at a time (:func:`ecofl.train.train_local`) on 2 CPU threads and on all
cores, the homes of a dispatch batched (:func:`ecofl.batched_training.train_homes_together`)
on the CPU, and where a GPU is present, one at a time and batched (20 and
100 homes) on it. A row's ``home_trainings_per_s`` is homes trained over wall
seconds (weights back on the host included, so a GPU's work is finished).

``fig7`` runs the Fig. 7 Eco-FL run of seed 0 (its archived config,
``docs/results/runs/fig7_300s_closing_rule/03_seed=0,strategy=ecofl``: 300
homes, 300 virtual s) through Flower's simulation engine or through the same
event loop over :class:`~ecofl.fl.inprocess.InProcessTransport` (the loop's
numbers are Flower's: ``tests/test_simulation.py``; this path needs neither
Flower nor Ray), and records its wall time and accuracy curve.

Rows merge into ``benchmarks/results/sim_speed.json`` by machine and mode, so
rows measured on several machines sit side by side; each names its machine.
Modes this machine cannot measure (a GPU here) stay "not measured". The
table goes to ``docs/sim_speed.md`` and the curves to ``docs/sim_speed_fig7.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch
import yaml

from benchmarks.markdown_section import replace_section
from client.federation import Federation
from ecofl.accelerator import device_label, resolve_device
from ecofl.batched_training import HomeJob, train_homes_together
from ecofl.fl.federation_setup import FederationSetup
from ecofl.train import TrainConfig, train_local
from ecofl.weights import get_weights, set_weights

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/sim_speed.json"
DOC = ROOT / "docs/sim_speed.md"
PLOT = ROOT / "docs/sim_speed_fig7.png"
FIG7_CONFIG = ROOT / "docs/results/runs/fig7_300s_closing_rule/03_seed=0,strategy=ecofl/.hydra/config.yaml"
TRAIN = TrainConfig(epochs=3, batch_size=10, lr=0.05, mu=0.05)
NOT_MEASURED = "not measured"
#: The GPU's modes: (mode, homes).
GPU_MODES = (("one-at-a-time", 20), ("batched", 20), ("batched", 100))


def machine() -> str:
    """This machine in words: cores, CPU model, memory, and its GPU where it has one."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    memory = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
    text = f"{os.cpu_count()}-core {platform.machine()} ({model}), {memory / 2**20:.0f} GiB"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def commit() -> str | None:
    """The code's git commit (None where the tree is not a git checkout, e.g. a copy on a GPU machine)."""
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or None if done.returncode == 0 else None


def fig7_federation(dataset_root: str | None) -> Federation:
    dataset = {"name": "fashion_mnist", **({"root": dataset_root} if dataset_root else {})}
    return Federation(FederationSetup(num_homes=300, dataset=dataset, seed=0))


def one_at_a_time(fed: Federation, homes: int, device: torch.device, threads: int) -> float:
    """Home trainings per second, ``homes`` homes trained one after another (after one untimed home)."""
    torch.set_num_threads(threads)
    initial = get_weights(fed.new_model())

    def train(home: int) -> None:
        model = fed.new_model()
        set_weights(model, initial)
        data = fed.home(home)
        train_local(model.to(device), data.x, data.y, TrainConfig(**{**TRAIN.__dict__, "seed": home}))
        get_weights(model)

    train(homes)  # warm-up: kernels, caches
    started = time.perf_counter()
    for home in range(homes):
        train(home)
    return homes / (time.perf_counter() - started)


def batched(fed: Federation, homes: int, device: torch.device, threads: int) -> float:
    """Home trainings per second, ``homes`` homes trained as one computation (after one untimed batch)."""
    torch.set_num_threads(threads)
    initial = get_weights(fed.new_model())

    def jobs(first: int) -> list[HomeJob]:
        return [HomeJob(fed.home(h).x, fed.home(h).y, TrainConfig(**{**TRAIN.__dict__, "seed": h}), initial)
                for h in range(first, first + homes)]

    train_homes_together(fed.new_model, jobs(100), device)  # warm-up
    work = jobs(0)
    started = time.perf_counter()
    train_homes_together(fed.new_model, work, device)
    return homes / (time.perf_counter() - started)


def measure_homes(dataset_root: str | None, cpu_homes: int) -> list[dict]:
    """Every mode this machine has, one after another in this process (module docstring)."""
    fed = fig7_federation(dataset_root)
    cores = os.cpu_count() or 1
    modes = [("cpu", min(2, cores), "one-at-a-time", cpu_homes)]
    if cores > 2:
        modes.append(("cpu", cores, "one-at-a-time", cpu_homes))
    modes.append(("cpu", cores, "batched", 20))
    if torch.cuda.is_available():
        modes += [("cuda", cores, mode, homes) for mode, homes in GPU_MODES]
    rows = []
    for kind, threads, mode, homes in modes:
        device = resolve_device(kind)
        measure = one_at_a_time if mode == "one-at-a-time" else batched
        load = os.getloadavg()[0]
        rate = measure(fed, homes, device, threads)
        row = {"machine": machine(), "device": device_label(device), "threads": threads, "mode": mode,
               "homes": homes, "home_trainings_per_s": rate, "load_before": load, "date": time.strftime("%Y-%m-%d"),
               "commit": commit()}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def run_fig7(engine: str, device: str, batch_homes: str, config: Path, dataset_root: str | None) -> dict:
    """One Fig. 7 run from ``config`` (a run's ``.hydra/config.yaml``) through ``engine``; its row."""
    from server.config import experiment

    settings = yaml.safe_load(config.read_text())
    settings["simulation"] = {**settings["simulation"], "device": device, "batch_homes": batch_homes}
    if dataset_root:
        settings["dataset"]["root"] = dataset_root
    exp = experiment(settings)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    out = ROOT / "outputs" / f"sim_speed_fig7_{engine}_{time.strftime('%Y%m%d-%H%M%S')}"
    if engine == "flower":
        from simulations.run import simulate

        summary = simulate(exp, out, progress=True)
    else:
        summary = in_process_run(exp, out)
    wall = time.perf_counter() - started
    rows = json.loads((out / "metrics.json").read_text())
    return {
        "machine": machine(), "engine": engine, "device": summary.get("device"), "batch_homes":
        summary.get("batch_homes"), "wall_s": wall, "updates": summary["updates"],
        "final_accuracy": summary["final_accuracy"], "time_to_target_s": summary["time_to_target_s"],
        "curve": [[r["virtual_time"], r["accuracy"]] for r in rows if r["accuracy"] is not None],
        "load_before": load, "load_after": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d"),
        "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
        "commit": commit(),
    }


def in_process_run(exp, out: Path) -> dict:
    """The experiment's event loop over the in-process transport (no Flower, no Ray); its summary."""
    from client.federation import federation
    from ecofl.fl.clock import VirtualClock
    from ecofl.fl.inprocess import InProcessTransport
    from ecofl.fl.loop import EventLoop
    from server.evaluation import GlobalEvaluator

    fed = federation(exp.setup.to_json())
    torch.set_num_threads(os.cpu_count() or 1)
    batch = exp.setup.batch_homes == "on" or (exp.setup.batch_homes == "auto" and fed.device.type != "cpu")
    transport = InProcessTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts,
                                   fed.latency_model, num_classes=fed.dataset.num_classes, device=fed.device,
                                   batch_homes=batch)
    evaluator = GlobalEvaluator(exp)
    loop = EventLoop(exp.loop, transport, range(exp.setup.num_homes), evaluator.initial_weights(), evaluator,
                     clock=VirtualClock(), out_dir=out, placement=transport.placement)
    loop.run()
    return json.loads((out / "summary.json").read_text())


def merge(old: dict, homes: list[dict] = (), fig7: list[dict] = ()) -> dict:
    """``old`` with the new rows, each replacing the row of its machine and mode; a GPU mode no machine has
    measured is a "not measured" row."""
    def home_key(row: dict) -> tuple:
        return row["machine"], row["device"].split(":")[0], row["threads"], row["mode"], row["homes"]

    def run_key(row: dict) -> tuple:
        return row["machine"], row["engine"], row["device"], row["batch_homes"]

    measured = {home_key(r): r for r in [*old.get("homes", []), *homes] if r["home_trainings_per_s"] != NOT_MEASURED}
    rows = list(measured.values())
    for mode, count in GPU_MODES:
        if not any(r["device"].startswith("cuda") and (r["mode"], r["homes"]) == (mode, count) for r in rows):
            rows.append({"machine": None, "device": "cuda", "threads": None, "mode": mode, "homes": count,
                         "home_trainings_per_s": NOT_MEASURED})
    runs = {run_key(r): r for r in [*old.get("fig7", []), *fig7]}
    return {"homes": rows, "fig7": list(runs.values())}


def markdown(results: dict) -> str:
    lines = ["Home trainings per second (a Fig. 7 home: 200 Fashion-MNIST samples, FedAvg CNN, 3 epochs of batch "
             "10, FedProx mu 0.05); the speed-up is against the same machine's one-at-a-time row on 2 CPU threads.",
             "", "| machine | device | threads | mode | homes | home trainings / s | speed-up | load | date |",
             "|---|---|---:|---|---:|---:|---:|---:|---|"]
    base = {r["machine"]: r["home_trainings_per_s"] for r in results["homes"]
            if r["mode"] == "one-at-a-time" and r["device"] == "cpu" and r["threads"] == 2}
    for r in results["homes"]:
        rate = r["home_trainings_per_s"]
        if rate == NOT_MEASURED:
            lines.append(f"| {NOT_MEASURED} | {r['device']} | | {r['mode']} | {r['homes']} | {NOT_MEASURED} | | | |")
            continue
        speedup = f"{rate / base[r['machine']]:.1f}x" if r["machine"] in base else ""
        lines.append(f"| {r['machine']} | {r['device']} | {r['threads']} | {r['mode']} | {r['homes']} | "
                     f"{rate:.2f} | {speedup} | {r['load_before']:.1f} | {r['date']} |")
    lines += ["", "A whole Fig. 7 Eco-FL run (300 homes, 300 virtual s, seed 0):", "",
              "| machine | engine | device | batched | wall s | updates | final accuracy | time to 70% (s) | "
              "load before/after | date | commit |", "|---|---|---|---|---:|---:|---:|---:|---|---|---|"]
    for r in results["fig7"]:
        target = "-" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f}"
        lines.append(f"| {r['machine']} | {r['engine']} | {r['device']} | {r['batch_homes']} | {r['wall_s']:.0f} | "
                     f"{r['updates']} | {r['final_accuracy']:.4f} | {target} | "
                     f"{r['load_before']:.1f}/{r['load_after']:.1f} | {r['date']} | {r.get('commit') or '-'} |")
    if not any(r["device"] != "cpu" for r in results["fig7"]):
        lines.append(f"| {NOT_MEASURED} | in-process | cuda | True | {NOT_MEASURED} | | | | | | |")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results["fig7"]:
        t, acc = zip(*r["curve"]) if r["curve"] else ((), ())
        ax.plot(t, acc, label=f"{r['engine']}, {r['device']}{', batched' if r['batch_homes'] else ''} "
                              f"({r['wall_s']:.0f} s wall)")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title("Fig. 7 Eco-FL, seed 0: one run per machine and path")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("homes", "fig7", "table"))
    parser.add_argument("--dataset-root", help="Fashion-MNIST in torchvision layout (default: Debian's files)")
    parser.add_argument("--cpu-homes", type=int, default=10, help="homes timed one at a time on the CPU")
    parser.add_argument("--engine", choices=("flower", "in-process"), default="in-process")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-homes", default="auto", choices=("auto", "on", "off"))
    parser.add_argument("--config", type=Path, default=FIG7_CONFIG)
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args()
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    if args.what == "homes":
        results = merge(results, homes=measure_homes(args.dataset_root, args.cpu_homes))
    elif args.what == "fig7":
        results = merge(results, fig7=[run_fig7(args.engine, args.device, args.batch_homes, args.config,
                                                args.dataset_root)])
    results = merge(results)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    table = markdown(results)
    if not replace_section(args.doc, table):
        print(f"{args.doc} has no benchmark section; the table:")
    print(table)
    if results.get("fig7"):
        plot(results, args.doc.with_name(PLOT.name))


if __name__ == "__main__":
    main()
