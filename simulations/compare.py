"""Strategies compared over seeds: mean accuracy curves and time to accuracy (docs/RESULTS.md).

    python -m simulations.compare /work/runs/fig7 --targets 0.6 0.7 --out docs/results/fig7

reads a sweep over strategies and seeds (``seed=0,1,2``; each run directory
as :mod:`simulations.plot` reads it), or several sweeps as one (an ablation
beside the figure it belongs to), and writes

* ``<out>_curves.png``: per strategy, the mean over seeds of the global test
  accuracy against virtual time, with the band between the lowest and the
  highest seed (each run's curve is a step function: at time t, its latest
  evaluation at or before t);
* ``<out>_time_to_accuracy.csv``: per strategy (and any other setting the
  sweep varies) and target, the virtual seconds each seed first evaluated at
  or above the target, their mean over the seeds that reached it, how many
  did, and the ratio of that mean to Eco-FL's;

and prints the time-to-accuracy table in Markdown. A seed that never reaches
a target counts in "reached" only; its time is left out of the mean.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

from simulations.plot import Run, _accuracy_axes, _save, plt, run_dirs

REFERENCE = "ecofl"
LABELS = {"ecofl": "Eco-FL", "ecofl_wo_dg": "Eco-FL w/o DG", "fedavg": "FedAvg", "fedasync": "FedAsync",
          "fedat": "FedAT", "astraea": "Astraea", "fedat_equal_weights": "FedAT (equal tier weights)"}


def time_to_accuracy(run: Run, target: float) -> float | None:
    """Virtual seconds of the run's first evaluation at or above ``target`` (None if none was)."""
    times, accuracies = run.curve()
    reached = np.flatnonzero(accuracies >= target)
    return float(times[reached[0]]) if reached.size else None


def accuracy_at(run: Run, grid: np.ndarray) -> np.ndarray:
    """The run's latest evaluated accuracy at each time of ``grid`` (NaN before its first evaluation)."""
    times, accuracies = run.curve()
    index = np.searchsorted(times, grid, side="right") - 1
    return np.where(index >= 0, accuracies[np.clip(index, 0, None)], np.nan) if times.size else grid * np.nan


def load_sweep(*sweeps: Path) -> list[Run]:
    """Every run under each of ``sweeps`` (their ``*/metrics.json``), each once; a clear exit for a directory
    without any."""
    found: dict[Path, Run] = {}
    for sweep in sweeps:
        paths = run_dirs(sweep)
        if not paths:
            raise SystemExit(f"no runs (*/metrics.json) under {sweep}")
        found.update({p.resolve(): Run.load(p) for p in paths if p.resolve() not in found})
    return list(found.values())


def varying_keys(runs: list[Run]) -> list[str]:
    """The overrides whose values differ between ``runs``, except ``seed`` (``strategy`` if none does)."""
    keys = sorted({key for run in runs for key in run.overrides if key != "seed"})
    return [key for key in keys if len({run.setting(key) for run in runs}) > 1] or ["strategy"]


def settings_of(runs: list[Run], keys: list[str] | None = None) -> dict[str, list[Run]]:
    """The sweep's runs per setting: their values of ``keys`` (default: those that vary; e.g. ``strategy=fedat``)."""
    keys = varying_keys(runs) if keys is None else keys
    settings: dict[str, list[Run]] = {}
    for run in runs:
        settings.setdefault(",".join(f"{k}={run.setting(k)}" for k in keys), []).append(run)
    return settings


def time_to_accuracy_table(settings: dict[str, list[Run]], targets: list[float]) -> list[dict]:
    """One row per setting and target: per-seed times, their mean, seeds reaching it, ratio to Eco-FL's mean
    (on the same values of the other settings; none where the sweep does not vary the strategy)."""
    rows = []
    for target in targets:
        means = {}
        for name, runs in settings.items():
            times = [time_to_accuracy(run, target) for run in sorted(runs, key=lambda r: str(r.setting("seed")))]
            reached = [t for t in times if t is not None]
            means[name] = float(np.mean(reached)) if reached else None
            rows.append({"setting": name, "strategy": runs[0].setting("strategy"), "target": target,
                         "seeds": len(times), "reached": len(reached), "mean_s": means[name],
                         "per_seed_s": ";".join("-" if t is None else f"{t:.1f}" for t in times)})
        for row in rows[-len(settings):]:  # a ratio between strategies, where the sweep varies the strategy
            parts = row["setting"].split(",")
            own = f"strategy={row['strategy']}"
            reference = means.get(",".join(f"strategy={REFERENCE}" if p == own else p for p in parts))
            row["ratio_to_ecofl"] = (row["mean_s"] / reference) if own in parts and row["mean_s"] and reference \
                else None
    return rows


def setting_label(name: str, strategy: str | None) -> str:
    """A setting as a reader names it: the strategy's name, then the other values (``FedAT, partition=rlg_iid``)."""
    if strategy is None:
        return name
    rest = other_values(name, strategy)
    return LABELS.get(strategy, strategy) + (f", {rest}" if rest else "")


def other_values(name: str, strategy: str) -> str:
    """A setting's values other than its strategy (``partition=rlg_iid``), or ``""``."""
    return ",".join(part for part in name.split(",") if part != f"strategy={strategy}")


def plot_mean_curves(settings: dict[str, list[Run]], path: Path, step_s: float = 5.0) -> Path:
    """Mean accuracy over seeds vs virtual time per setting, with the min-max band over seeds.

    Strategies compared on more than one value of something else (Fig. 8: partition) get one panel per value;
    otherwise (Fig. 7's strategies, Fig. 9's lambdas) every setting is a line of one panel.
    """
    end = max(run.curve()[0].max() for runs in settings.values() for run in runs if run.curve()[0].size)
    grid = np.arange(step_s, end + step_s / 2, step_s)
    by_strategy = len({runs[0].setting("strategy") for runs in settings.values()}) > 1
    panels: dict[str, dict[str, list[Run]]] = {}
    for name, runs in settings.items():
        strategy = runs[0].setting("strategy")
        label = LABELS.get(strategy, str(strategy)) if by_strategy else setting_label(name, strategy)
        panels.setdefault(other_values(name, strategy) if by_strategy else "", {})[label] = runs
    figure, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 4.5), squeeze=False, sharey=True)
    for ax, (title, members) in zip(axes[0], sorted(panels.items())):
        for label, runs in members.items():
            curves = np.stack([accuracy_at(run, grid) for run in runs])
            evaluated = ~np.isnan(curves).all(axis=0)  # before every seed's first evaluation there is no mean
            curves, times = curves[:, evaluated], grid[evaluated]
            line, = ax.plot(times, np.nanmean(curves, axis=0), label=f"{label} ({len(runs)} seeds)")
            ax.fill_between(times, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), color=line.get_color(),
                            alpha=0.15, linewidth=0)
        _accuracy_axes(ax, None)
        ax.set_title(title)
        ax.legend(fontsize="small", loc="lower right")
    return _save(figure, path)


def markdown(rows: list[dict]) -> str:
    lines = ["| strategy | target | seeds reaching | mean virtual s | per seed (s) | ratio to Eco-FL |",
             "|---|---:|---|---:|---|---:|"]
    for row in rows:
        mean = f"{row['mean_s']:.1f}" if row["mean_s"] is not None else "-"
        ratio = f"{row['ratio_to_ecofl']:.2f}" if row["ratio_to_ecofl"] is not None else "-"
        lines.append(f"| {setting_label(row['setting'], row['strategy'])} | {row['target']:.0%} | "
                     f"{row['reached']} of {row['seeds']} | {mean} | "
                     f"{row['per_seed_s']} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", type=Path, nargs="+", metavar="sweep",
                        help="sweep directories (runs under */metrics.json), compared as one")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.7])
    parser.add_argument("--out", type=Path, required=True, help="prefix of the files written")
    args = parser.parse_args(argv)
    settings = settings_of(load_sweep(*args.sweeps))
    rows = time_to_accuracy_table(settings, args.targets)
    table = args.out.parent / f"{args.out.name}_time_to_accuracy.csv"
    with open(table, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {table}")
    print(f"wrote {plot_mean_curves(settings, args.out.parent / f'{args.out.name}_curves.png')}")
    print(markdown(rows))


if __name__ == "__main__":
    main()
