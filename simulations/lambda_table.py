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
  evaluation): means over seeds ("-" where a run has no evaluation);
* late accuracy (the mean of the evaluations in the run's second half): mean
  ± sample standard deviation over seeds, and each seed's (``seed: value``);
* per target accuracy: how many seeds reached it, and the mean of their first
  times (as :mod:`simulations.compare`).

``--until S`` cuts every run at virtual second S, keeping its updates and
evaluations up to then, e.g. to set it beside an older, shorter sweep. The
updates, groupings and evaluations up to S are those of a run stopped at S,
but the final accuracy may not be: the loop also evaluates a run's last
update, which a cut run has no evaluation of. ``--seeds`` keeps only the
given seeds. Every run needs a lambda and an integer seed, and no two runs
may share both.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from simulations.compare import load_sweep, time_to_accuracy
from simulations.plot import TIME, Run


def lambda_of(run: Run) -> float:
    """The run's ``grouping.lambda`` (:meth:`Run.grouping_lambda`); a clear exit where it has none."""
    value = run.grouping_lambda()
    if value is None:
        raise SystemExit(f"{run.path}: no grouping.lambda in its overrides or config (is this a Fig. 9 sweep?)")
    return value


def seed_of(run: Run) -> int:
    """The run's seed (its override or its config); a clear exit where it has none or not an integer."""
    value = run.setting("seed")
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SystemExit(f"{run.path}: no integer seed in its overrides or config (got {value!r})") from None


def runs_by_lambda(runs: list[Run]) -> dict[float, list[Run]]:
    """The runs per lambda, ascending, each lambda's runs in seed order; a clear exit for two runs of one seed."""
    by_lambda: dict[float, dict[int, Run]] = {}
    for run in runs:
        lam, seed = lambda_of(run), seed_of(run)
        seeds = by_lambda.setdefault(lam, {})
        if seed in seeds:
            raise SystemExit(f"two runs of lambda {lam:g}, seed {seed}: {seeds[seed].path} and {run.path}")
        seeds[seed] = run
    return {lam: [seeds[seed] for seed in sorted(seeds)] for lam, seeds in sorted(by_lambda.items())}


def final_accuracy(run: Run) -> float:
    """The run's last evaluated accuracy (NaN if it has none)."""
    accuracies = run.curve()[1]
    return float(accuracies[-1]) if accuracies.size else float("nan")


def best_accuracy(run: Run) -> float:
    """The run's highest evaluated accuracy (NaN if it has none)."""
    accuracies = run.curve()[1]
    return float(accuracies.max()) if accuracies.size else float("nan")


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
            "late_mean": float(late.mean()), "late_std": float(late.std(ddof=1)) if len(late) > 1 else float("nan"),
            "late_per_seed": {seed_of(run): float(value) for run, value in zip(seeds, late)},
            "final": float(np.mean([final_accuracy(run) for run in seeds])),
            "best": float(np.mean([best_accuracy(run) for run in seeds])),
        }
        for target in targets:
            reached = [t for t in (time_to_accuracy(run, target) for run in seeds) if t is not None]
            row[f"reached_{target:g}"] = len(reached)
            row[f"mean_s_{target:g}"] = float(np.mean(reached)) if reached else None
        rows.append(row)
    return rows


def until(run: Run, seconds: float) -> Run:
    """The run's updates and evaluations up to virtual second ``seconds`` (see the module docstring)."""
    return dataclasses.replace(run, rows=[row for row in run.rows if row[TIME] <= seconds])


def _number(value: float | None, digits: int) -> str:
    """``value`` to ``digits`` decimals, or "-" where there is none (None or NaN)."""
    return "-" if value is None or np.isnan(value) else f"{value:.{digits}f}"


def markdown(rows: list[dict], targets: list[float]) -> str:
    header = ["lambda", "group JS", "group round (s)", "mean round (s)", "global updates", "late accuracy",
              "late per seed", "final", "best", *(f"{target:.0%}: seeds, mean s" for target in targets)]
    align = ["---:"] * 6 + ["---"] + ["---:"] * 2 + ["---"] * len(targets)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in rows:
        seeds = row["seeds"]
        rounds = _number(row["mean_round_s"], 2)
        if 0 < row["round_seeds"] < seeds:
            rounds += f" ({row['round_seeds']} seed{'s' if row['round_seeds'] > 1 else ''})"
        late = _number(row["late_mean"], 3) + ("" if np.isnan(row["late_std"]) else f" ± {row['late_std']:.3f}")
        per_seed = ", ".join(f"{seed}: {_number(value, 3)}" for seed, value in row["late_per_seed"].items())
        cells = [f"{row['lambda']:g}", _number(row["group_js"], 3), _number(row["group_round_s"], 2), rounds,
                 f"{row['updates']:.0f}", late, per_seed, _number(row["final"], 3), _number(row["best"], 3)]
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
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="only these seeds (default: all)")
    parser.add_argument("--out", type=Path, help="prefix of the Markdown file written (<out>_lambda_table.md)")
    args = parser.parse_args(argv)
    runs = load_sweep(args.sweep)
    if args.seeds is not None:
        missing = sorted(set(args.seeds) - {seed_of(run) for run in runs})
        if missing:
            raise SystemExit(f"no runs of seed {', '.join(map(str, missing))} under {args.sweep}")
        runs = [run for run in runs if seed_of(run) in args.seeds]
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
