"""Eco-FL Fig. 9 as a table: per lambda, its seeds' grouping, round times and accuracy (docs/RESULTS.md).

    python -m simulations.lambda_table docs/results/runs/fig9_200s_closing_rule --targets 0.6 0.7 \\
        --out docs/results/fig9_200s_closing_rule

reads a sweep over ``grouping.lambda`` and seeds (run directories as
:mod:`simulations.plot` reads them) and prints one Markdown row per lambda,
ascending, also written to ``<out>_lambda_table.md``:

* group JS and group round: the mean over seeds of each run's mean group
  Jensen-Shannon divergence and expected group round latency (Eco-FL eq. 4's
  two terms, from the metrics rows);
* mean round: a round's measured start to close, averaged over the seeds
  whose rows carry round times (their number is given when some do not);
* global updates, final and best accuracy (the last and the highest
  evaluation): means over seeds;
* late accuracy (the mean of the evaluations in the run's second half): mean
  ± sample standard deviation over seeds, and each seed's, in seed order;
* per target accuracy: how many seeds reached it, and the mean of their first
  times (as :mod:`simulations.compare`).

``--until S`` cuts every run at virtual second S (the table of a shorter
run, e.g. to set beside an older sweep of that length) and ``--seeds`` keeps
only the given seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from simulations.compare import load_sweep, time_to_accuracy
from simulations.plot import TIME, Run


def runs_by_lambda(runs: list[Run]) -> dict[float, list[Run]]:
    """The runs per lambda, ascending, each lambda's runs in seed order; a clear exit for a run without lambda."""
    by_lambda: dict[float, list[Run]] = {}
    for run in runs:
        lam = run.grouping_lambda()
        if lam is None:
            raise SystemExit(f"{run.path}: its config has no grouping.lambda (is this a Fig. 9 sweep?)")
        by_lambda.setdefault(lam, []).append(run)
    return {lam: sorted(by_lambda[lam], key=lambda run: int(run.setting("seed") or 0)) for lam in sorted(by_lambda)}


def lambda_rows(runs: list[Run], targets: list[float]) -> list[dict]:
    """One row of figures per lambda (see the module docstring)."""
    rows = []
    for lam, seeds in runs_by_lambda(runs).items():
        late = np.array([run.late_accuracy() for run in seeds])
        rounds = [value for value in (run.mean_round_s() for run in seeds) if not np.isnan(value)]
        row = {
            "lambda": lam, "seeds": len(seeds),
            "group_js": float(np.mean([run.mean_of("mean_group_js") for run in seeds])),
            "group_round_s": float(np.mean([run.mean_of("mean_group_latency") for run in seeds])),
            "mean_round_s": float(np.mean(rounds)) if rounds else None, "round_seeds": len(rounds),
            "updates": float(np.mean([len(run.rows) for run in seeds])),
            "late_mean": float(late.mean()), "late_std": float(late.std(ddof=1)) if len(late) > 1 else None,
            "late_per_seed": [float(value) for value in late],
            "final": float(np.mean([run.curve()[1][-1] for run in seeds])),
            "best": float(np.mean([run.curve()[1].max() for run in seeds])),
        }
        for target in targets:
            reached = [t for t in (time_to_accuracy(run, target) for run in seeds) if t is not None]
            row[f"reached_{target:g}"] = len(reached)
            row[f"mean_s_{target:g}"] = float(np.mean(reached)) if reached else None
        rows.append(row)
    return rows


def until(run: Run, seconds: float) -> Run:
    """The run as if it had stopped at virtual second ``seconds``: its updates up to then."""
    return dataclasses.replace(run, rows=[row for row in run.rows if row[TIME] <= seconds])


def markdown(rows: list[dict], targets: list[float]) -> str:
    header = ["lambda", "group JS", "group round (s)", "mean round (s)", "global updates", "late accuracy",
              "late per seed", "final", "best", *(f"{target:.0%}: seeds, mean s" for target in targets)]
    align = ["---:"] * 6 + ["---"] + ["---:"] * 2 + ["---"] * len(targets)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        seeds = row["seeds"]
        rounds = "-" if row["mean_round_s"] is None else f"{row['mean_round_s']:.2f}"
        if 0 < row["round_seeds"] < seeds:
            rounds += f" ({row['round_seeds']} seed{'s' if row['round_seeds'] > 1 else ''})"
        late = f"{row['late_mean']:.3f}" + ("" if row["late_std"] is None else f" ± {row['late_std']:.3f}")
        cells = [f"{row['lambda']:g}", f"{row['group_js']:.3f}", f"{row['group_round_s']:.2f}", rounds,
                 f"{row['updates']:.0f}", late, ", ".join(f"{value:.3f}" for value in row["late_per_seed"]),
                 f"{row['final']:.3f}", f"{row['best']:.3f}"]
        for target in targets:
            reached, mean = row[f"reached_{target:g}"], row[f"mean_s_{target:g}"]
            cells.append(f"{reached} of {seeds}" + ("" if mean is None else f", {mean:.1f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a sweep directory over grouping.lambda (runs under */metrics.json)")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.7])
    parser.add_argument("--until", type=float, default=None, help="cut every run at this virtual second")
    parser.add_argument("--seeds", nargs="+", default=None, help="only these seeds (default: all)")
    parser.add_argument("--out", type=Path, help="prefix of the Markdown file written (<out>_lambda_table.md)")
    args = parser.parse_args(argv)
    runs = [run for run in load_sweep(args.sweep) if args.seeds is None or run.setting("seed") in args.seeds]
    if not runs:
        raise SystemExit(f"no runs of seeds {', '.join(args.seeds)} under {args.sweep}")
    if args.until is not None:
        runs = [until(run, args.until) for run in runs]
    table = markdown(lambda_rows(runs, args.targets), args.targets)
    if args.out is not None:
        path = args.out.parent / f"{args.out.name}_lambda_table.md"
        path.write_text(table + "\n")
        print(f"wrote {path}")
    print(table)


if __name__ == "__main__":
    main()
