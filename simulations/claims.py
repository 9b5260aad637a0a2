"""The same figure under two conditions side by side: the paper's waiting rounds and the deadline variant.

    python -m simulations.claims paper=docs/results/runs/fig7_paper_conditions \\
        deadline=docs/results/runs/fig7_300s_closing_rule --until 300 --targets 0.6 0.7 0.75

Each ``NAME=SWEEP`` is a directory of runs (as :mod:`simulations.compare`
reads it) under one condition. Per condition and setting (strategy, and any
other value the sweep varies) over its seeds, the table gives the virtual
seconds to each target accuracy (mean over the seeds that reached it, how
many did, and the ratio to Eco-FL's under the same condition), the late
accuracy (mean of the second half's evaluations) with its spread over
seeds, the stragglers per run, the mean time from a round's start to its
close, and the updates per run. ``--until S`` cuts every run at virtual
second S first, so sweeps of different lengths are compared on one horizon;
``--seeds`` keeps only the runs of those seeds (a one-seed ablation beside
a three-seed sweep):

    python -m simulations.claims paper=docs/results/runs/fig7_paper_conditions \
        churn=docs/results/runs/fig7_ablation_churn --seeds 0 --until 300
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from simulations.compare import LABELS, load_sweep, other_values, settings_of, time_to_accuracy_table
from simulations.lambda_table import seed_of, until
from simulations.plot import Run


def condition_rows(name: str, runs: list[Run], targets: list[float]) -> list[dict]:
    """One row per setting of ``runs``: the table's columns (module docstring)."""
    settings = settings_of(runs)
    times = time_to_accuracy_table(settings, targets)
    rows = []
    for setting, members in settings.items():
        late = [run.late_accuracy() for run in members]
        row = {
            "condition": name, "setting": setting, "strategy": members[0].setting("strategy"), "seeds": len(members),
            "late_mean": float(np.mean(late)), "late_sd": float(np.std(late, ddof=1)) if len(late) > 1 else 0.0,
            "stragglers": float(np.mean([sum(r.get("stragglers", 0) for r in run.rows) for run in members])),
            "round_s": _mean_of_known([run.mean_round_s() for run in members]),
            "updates": float(np.mean([len(run.rows) for run in members])),
        }
        for t in (t for t in times if t["setting"] == setting):
            row[f"t{t['target']:g}"] = (t["mean_s"], t["reached"], t["ratio_to_ecofl"])
        rows.append(row)
    return rows


def _mean_of_known(values: list[float]) -> float:
    """The mean of the values that are not NaN (NaN when none is: runs from before round times were kept)."""
    known = [v for v in values if not np.isnan(v)]
    return float(np.mean(known)) if known else float("nan")


def markdown(rows: list[dict], targets: list[float]) -> str:
    head = ["condition", "strategy", *[f"to {t:.0%} (s, seeds, x Eco-FL)" for t in targets],
            "late accuracy", "stragglers / run", "round (s)", "updates / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for row in rows:
        cells = [row["condition"], LABELS.get(row["strategy"], str(row["strategy"]))
                 + (f", {rest}" if (rest := other_values(row["setting"], str(row["strategy"]))) else "")]
        for target in targets:
            mean, reached, ratio = row[f"t{target:g}"]
            cells.append("-" if mean is None else
                         f"{mean:.0f} ({reached}/{row['seeds']}{f', {ratio:.2f}x' if ratio else ''})")
        cells += [f"{row['late_mean']:.3f} ± {row['late_sd']:.3f}", f"{row['stragglers']:.0f}",
                  "-" if np.isnan(row["round_s"]) else f"{row['round_s']:.2f}", f"{row['updates']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("conditions", nargs="+", metavar="NAME=SWEEP", help="a condition's name and its runs")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.7, 0.75])
    parser.add_argument("--until", type=float, default=None, help="cut every run at this virtual second")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="only the runs of these seeds")
    args = parser.parse_args(argv)
    rows = []
    for condition in args.conditions:
        name, sep, sweep = condition.partition("=")
        if not sep or not name:
            parser.error(f"expected NAME=SWEEP, got {condition!r}")
        runs = load_sweep(Path(sweep))
        if args.seeds is not None:
            runs = [run for run in runs if seed_of(run) in args.seeds]
            if not runs:
                parser.error(f"{sweep} has no run of seed {', '.join(map(str, args.seeds))}")
        if args.until is not None:
            runs = [until(run, args.until) for run in runs]
        rows += condition_rows(name, runs, args.targets)
    print(markdown(rows, args.targets))


if __name__ == "__main__":
    main()
