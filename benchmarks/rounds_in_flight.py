"""Rounds in flight trained side by side (``server.train_in_background``) against each dispatch waiting for its replies.

    .venv/bin/python -m benchmarks.rounds_in_flight                          # FedAsync and Eco-FL, 60 virtual s
    .venv/bin/python -m benchmarks.rounds_in_flight --until 30 --strategies fedasync

Each strategy runs Fig. 7 under the paper's conditions (``+experiment=fig7``,
seed 0: 300 homes, Fashion-MNIST, Flower's simulation engine as configured:
2 actors on a CPU) to ``--until`` virtual seconds twice, one run right after
the other: with ``server.train_in_background=false`` (every dispatch waits
for its replies before the loop goes on) and ``true`` (the server foresees
each round's completion from the homes' latency model and waits only for the
round it applies next: ``ecofl/fl/foreseen_rounds.py``). The order
alternates from one strategy to the next, so that neither setting always
runs first. Each run is the real entry point in a subprocess
(``python -m simulations.run``).

Per run, from its ``timing.json``, ``summary.json`` and ``experiment.json``:
where the homes trained (device, batched or not, actors asked for), the wall
seconds after start-up (the first round sent) to the end, updates per second
of them, and the homes' own training seconds per wall second after start-up
(how many actors were training on average; only replies the server
collected count, so tasks still training when a run ends are left out). Both
runs must apply the same updates: the metrics rows without their wall times
are compared, and ``same updates`` says whether they are. The load average
before and after each run is recorded (the machine is shared).
Writes ``benchmarks/results/rounds_in_flight.json`` and the table into
docs/simulation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.markdown_section import publish

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/rounds_in_flight.json"
DOC = ROOT / "docs/simulation.md"
SECTION = "rounds-in-flight"


def run(strategy: str, background: bool, until: float, out: Path) -> dict:
    """One Fig. 7 run to ``until`` virtual seconds; its figures and its metrics rows."""
    command = [sys.executable, "-m", "simulations.run", "+experiment=fig7", f"strategy={strategy}", "seed=0",
               f"loop.max_virtual_time_s={until:g}", f"server.train_in_background={str(background).lower()}",
               "plot=false", f"hydra.run.dir={out}"]
    load_before = os.getloadavg()[0]
    with open(out.with_suffix(".log"), "w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}); see {out.with_suffix('.log')}")
    timing = json.loads((out / "timing.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    rows = json.loads((out / "metrics.json").read_text())
    if timing["startup_s"] is None or not summary["updates"]:
        raise SystemExit(f"{out}: no training round was sent or no update applied; see {out.with_suffix('.log')}")
    after_startup = timing["wall_s"] - timing["startup_s"]
    actors = json.loads((out / "experiment.json").read_text())["simulation"]["actors"]
    return {
        "strategy": strategy, "train_in_background": timing["train_in_background"], "homes": summary["num_homes"],
        "device": summary["device"], "batch_homes": summary["batch_homes"], "actors": actors,
        "updates": summary["updates"],
        "failed": summary["failed_total"], "wall_after_startup_s": after_startup,
        "updates_per_s": summary["updates"] / after_startup, "home_train_s": timing["home_train_s"],
        "actors_training": timing["home_train_s"] / after_startup, "train_replies": timing["train_replies"],
        "load_before": load_before, "load_after": os.getloadavg()[0],
        "rows": [{k: v for k, v in row.items() if "wall" not in k} for row in rows],
    }


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['cpus']} cores (commit {result['commit']}), `python -m "
             f"benchmarks.rounds_in_flight --until {result['until']:g}`: Fig. 7 under the paper's conditions, seed 0, "
             f"to {result['until']:g} virtual s, Flower's simulation engine; the two runs of a strategy one right "
             "after the other, in the order listed. `actors training`: the homes' own training seconds per wall "
             "second after start-up.", "",
             "| strategy | train_in_background | homes, where they trained | updates | failed | "
             "wall s after start-up | updates / s | actors training | same updates | speed-up | load before/after |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for pair in result["pairs"]:
        waiting, background = sorted(pair["runs"], key=lambda r: r["train_in_background"])
        for run_ in pair["runs"]:
            speedup = (f"{waiting['wall_after_startup_s'] / background['wall_after_startup_s']:.2f}x"
                       if run_ is background else "")
            where = f"{run_['homes']}, {run_['device']}{' batched' if run_['batch_homes'] else ''}, " \
                    f"{run_['actors']} actors"
            lines.append(
                f"| {run_['strategy']} | {str(run_['train_in_background']).lower()} | {where} | {run_['updates']} | "
                f"{run_['failed']} | {run_['wall_after_startup_s']:.0f} | {run_['updates_per_s']:.2f} | "
                f"{run_['actors_training']:.2f} | {'yes' if pair['identical'] else 'NO'} | {speedup} | "
                f"{run_['load_before']:.1f}/{run_['load_after']:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--until", type=float, default=60.0, help="virtual seconds per run")
    parser.add_argument("--strategies", nargs="+", default=["fedasync", "ecofl"])
    args = parser.parse_args()
    scratch = ROOT / "outputs" / f"rounds_in_flight_{time.strftime('%Y%m%d-%H%M%S')}"
    scratch.mkdir(parents=True)
    pairs = []
    for index, strategy in enumerate(args.strategies):
        order = (False, True) if index % 2 == 0 else (True, False)
        runs = [run(strategy, background, args.until, scratch / f"{strategy}_{background}") for background in order]
        print(", ".join(f"{strategy} train_in_background={str(r['train_in_background']).lower()}: "
                        f"{r['wall_after_startup_s']:.0f} s" for r in runs), flush=True)
        pairs.append({"identical": runs[0]["rows"] == runs[1]["rows"],
                      "runs": [{k: v for k, v in r.items() if k != "rows"} for r in runs]})
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "until": args.until,
              "commit": commit.stdout.strip() or None, "pairs": pairs}
    publish(result, RESULTS, markdown(result), DOC, SECTION)


if __name__ == "__main__":
    main()
