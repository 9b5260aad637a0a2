"""Plots of simulation runs: one run, or the runs of a Hydra sweep overlaid.

    python -m simulations.plot outputs/2026-01-01/12-00-00_ecofl  # one run -> accuracy.png
    python -m simulations.plot multirun/2026-01-01/12-00-00       # a sweep -> sweep_accuracy.png,
                                                                  #   sweep.csv (+ sweep_lambda.png, sweep_seeds.csv)

A run directory holds the event loop's ``metrics.json`` and ``summary.json``
and Hydra's ``.hydra/config.yaml``. A sweep's runs are overlaid as accuracy
vs virtual time (Eco-FL Figs. 7 and 8); when the runs differ in
``grouping.lambda`` a second figure shows, against lambda, the mean group JS
divergence, the mean group latency and the accuracy (Fig. 9); when they
differ in ``seed``, ``sweep_seeds.csv`` holds each setting's mean and
standard deviation over the seeds. Multiruns call
:class:`SweepPlot` at their end (``hydra.callbacks`` in ``conf/config.yaml``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from hydra.experimental.callback import Callback  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

TIME = "virtual_time"
ACCURACY = "accuracy"


#: Where a run's metric rows are: ``metrics.json`` as the run wrote it, or gzipped where an archived run is large
#: (``scripts/rerun_figures.sh``: a FedAsync run of 1,200 virtual s has 4,000 rows, 2.6 MiB of JSON).
METRICS_FILES = ("metrics.json", "metrics.json.gz")


def run_dirs(sweep: Path) -> list[Path]:
    """The run directories under ``sweep``: those holding metric rows."""
    return sorted({path.parent for name in METRICS_FILES for path in sweep.glob(f"*/{name}")})


def read_metrics(run: Path) -> list[dict]:
    """A run directory's metric rows, from either of :data:`METRICS_FILES`."""
    plain = run / METRICS_FILES[0]
    if plain.is_file():
        return json.loads(plain.read_text())
    with gzip.open(run / METRICS_FILES[1], "rt") as rows:
        return json.load(rows)


@dataclass(frozen=True)
class Run:
    """One finished run: its metric rows, summary and (if Hydra wrote it) its config."""

    path: Path
    rows: list[dict]
    summary: dict
    config: dict

    @classmethod
    def load(cls, path: Path) -> Run:
        config_file = path / ".hydra" / "config.yaml"
        config = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False) if config_file.is_file() else {}
        return cls(
            path=path,
            rows=read_metrics(path),
            summary=json.loads((path / "summary.json").read_text()),
            config=config,
        )

    @property
    def label(self) -> str:
        """The run's overrides (Hydra's sweep sub-directory name without its number), or its path."""
        name = self.path.name
        head, _, tail = name.partition("_")
        return tail if head.isdigit() and tail else name

    @property
    def overrides(self) -> dict[str, str]:
        """The sweep's overrides of this run, from its label (``partition=rlg_iid,strategy=ecofl``)."""
        return dict(part.split("=", 1) for part in self.label.split(",") if "=" in part)

    def setting(self, key: str) -> str | None:
        """This run's value of ``key`` (dotted): its override, else its Hydra config's value.

        Runs of two sweeps written into one directory (``seed=1,2`` added to
        a sweep that ran the default seed) are then compared on equal terms.
        A config group's value is its option's ``name`` (``strategy`` ->
        ``ecofl``), as on the command line.
        """
        if key in self.overrides:
            return self.overrides[key]
        node: object = self.config
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        if isinstance(node, dict) and "name" in node:
            node = node["name"]
        return None if isinstance(node, (dict, list)) else str(node)

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(virtual time, accuracy) of the evaluated updates."""
        points = [(r[TIME], r[ACCURACY]) for r in self.rows if r.get(ACCURACY) is not None]
        if not points:
            return np.zeros(0), np.zeros(0)
        times, accuracies = zip(*points)
        return np.asarray(times, dtype=float), np.asarray(accuracies, dtype=float)

    def late_accuracy(self) -> float:
        """Mean accuracy of the evaluations in the second half of the run's virtual time.

        One evaluation of an asynchronously mixed model swings by several
        points from one group update to the next; this is the steadier figure
        to compare runs by.
        """
        times, accuracies = self.curve()
        if not times.size:
            return float("nan")
        return float(accuracies[times >= times[-1] / 2].mean())

    def mean_round_s(self) -> float:
        """Mean time from a round's start to its close (clock seconds; NaN for runs without round times)."""
        spans = [r["round_closed_s"] - r["round_started_s"] for r in self.rows
                 if r.get("round_closed_s") is not None and r.get("round_started_s") is not None]
        return float(np.mean(spans)) if spans else float("nan")

    def mean_of(self, column: str) -> float:
        values = [r[column] for r in self.rows if r.get(column) is not None]
        return float(np.mean(values)) if values else float("nan")

    def grouping_lambda(self) -> float | None:
        """The run's ``grouping.lambda`` (its override, else its config), or None."""
        value = self.setting("grouping.lambda")
        return None if value is None else float(value)


def plot_run(run_dir: Path) -> Path:
    """accuracy.png of one run: global test accuracy vs virtual time."""
    run = Run.load(run_dir)
    figure, axes = plt.subplots(figsize=(6, 4))
    times, accuracies = run.curve()
    strategy = (run.config.get("strategy") or {}).get("name", "")
    axes.plot(times, accuracies, marker=".", label=strategy or None)
    _accuracy_axes(axes, run.summary.get("target_accuracy"))
    if strategy:
        axes.legend()
    if run.config:
        dataset = (run.config.get("dataset") or {}).get("name", "")
        scheme = (run.config.get("partition") or {}).get("scheme", "")
        axes.set_title(f"{dataset}, {run.config.get('homes')} homes, {scheme}", fontsize="medium")
    return _save(figure, run_dir / "accuracy.png")


def plot_sweep(sweep_dir: Path) -> list[Path]:
    """Overlay the runs under ``sweep_dir``; returns the files written."""
    runs = [Run.load(path) for path in run_dirs(sweep_dir)]
    if not runs:
        raise FileNotFoundError(f"no runs (*/metrics.json) under {sweep_dir}")
    written = [_write_table(runs, sweep_dir / "sweep.csv")]
    if len({run.setting("seed") for run in runs}) > 1:
        written.append(_write_seed_table(runs, sweep_dir / "sweep_seeds.csv"))
    panels = accuracy_panels(runs)
    figure, axes = plt.subplots(1, len(panels), figsize=(1 + 6 * len(panels), 4.5), squeeze=False, sharey=True)
    for ax, (title, members) in zip(axes[0], panels.items()):
        for label, run in members:
            ax.plot(*run.curve(), marker=".", label=label)  # a marker: a run evaluated once is still seen
        _accuracy_axes(ax, runs[0].summary.get("target_accuracy"))
        ax.legend(fontsize="small")
        if title:
            ax.set_title(title, fontsize="medium")
    written.append(_save(figure, sweep_dir / "sweep_accuracy.png"))
    lambdas = [run.grouping_lambda() for run in runs]
    if None not in lambdas and len(set(lambdas)) > 1:
        written.append(plot_lambda(runs, sweep_dir / "sweep_lambda.png"))
    return written


def accuracy_panels(runs: list[Run]) -> dict[str, list[tuple[str, Run]]]:
    """Runs per accuracy panel, each with its legend label.

    A sweep over strategies and something else (Fig. 8: strategy x partition)
    gets one panel per value of the something else, strategies in the legend;
    any other sweep one panel, each run labelled by the overrides that vary
    (an override every run shares, such as a time limit, is left out).
    """
    varying = [key for key in _override_keys(runs) if len({run.setting(key) for run in runs}) > 1]
    if "strategy" not in varying or len(varying) < 2:
        return {"": [(_describe(run, varying), run) for run in runs]}
    panels: dict[str, list[tuple[str, Run]]] = {}
    for run in runs:
        title = ",".join(f"{key}={run.setting(key)}" for key in varying if key != "strategy")
        panels.setdefault(title, []).append((run.setting("strategy"), run))
    return dict(sorted(panels.items()))


def _describe(run: Run, keys: list[str]) -> str:
    """A legend label: the run's values of the overrides that differ across the sweep (its label if none)."""
    if keys == ["strategy"]:
        return run.setting("strategy")
    return ",".join(f"{key}={run.setting(key)}" for key in keys) or run.label


def _override_keys(runs: list[Run]) -> list[str]:
    """Every key some run of the sweep overrides, sorted."""
    return sorted({key for run in runs for key in run.overrides})


def over_lambda(runs: list[Run], value_of: Callable[[Run], float]) -> tuple[list[float], np.ndarray, np.ndarray,
                                                                           np.ndarray]:
    """Per lambda (ascending): the mean of ``value_of`` over its runs (the seeds), their lowest and highest."""
    by_lambda: dict[float, list[float]] = {}
    for run in runs:
        by_lambda.setdefault(run.grouping_lambda(), []).append(value_of(run))
    lambdas = sorted(by_lambda)
    values = [np.array(by_lambda[lam], dtype=float) for lam in lambdas]
    return (lambdas, np.array([v.mean() for v in values]), np.array([v.min() for v in values]),
            np.array([v.max() for v in values]))


def plot_lambda(runs: list[Run], path: Path) -> Path:
    """Eco-FL Fig. 9: mean group JS divergence, mean group latency and late accuracy vs lambda.

    Runs of the same lambda (seeds) are one point, their mean, with a bar from the lowest to the highest seed.
    """
    figures = [
        ("mean group JS divergence", lambda run: run.mean_of("mean_group_js")),
        ("mean group round latency (s)", lambda run: run.mean_of("mean_group_latency")),
        ("test accuracy (mean, 2nd half)", Run.late_accuracy),
    ]
    counts = {sum(r.grouping_lambda() == run.grouping_lambda() for r in runs) for run in runs}
    seeds, fewest = max(counts), min(counts)
    described = f"{seeds}" if fewest == seeds else f"{fewest}-{seeds}"  # a sweep still running has fewer somewhere
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (title, value_of) in zip(axes, figures):
        lambdas, means, lows, highs = over_lambda(runs, value_of)
        ax.errorbar(lambdas, means, yerr=[means - lows, highs - means] if seeds > 1 else None, marker="o", capsize=3)
        ax.set_xscale("symlog", linthresh=1.0)  # lambda spans 0 to hundreds
        ax.set_xlabel("lambda")
        ax.set_title(title + (f"\nmean of {described} seeds, bar: lowest to highest" if seeds > 1 else ""))
        ax.grid(alpha=0.3)
    return _save(figure, path)


def _write_table(runs: list[Run], path: Path) -> Path:
    keys = sorted({k for run in runs for k, v in run.summary.items() if not isinstance(v, (dict, list))})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "lambda", "mean_group_js", "mean_group_latency", "late_accuracy", "mean_round_s",
                         *keys])
        for run in runs:
            writer.writerow([run.label, run.grouping_lambda(), run.mean_of("mean_group_js"),
                             run.mean_of("mean_group_latency"), run.late_accuracy(), run.mean_round_s(),
                             *(run.summary.get(k) for k in keys)])
    return path


#: Per-run figures that :func:`seed_summary` averages over seeds.
SEED_FIGURES = ("late_accuracy", "final_accuracy", "best_accuracy", "mean_group_js", "mean_group_latency", "updates",
                "mean_round_s")


def seed_summary(runs: list[Run]) -> list[dict]:
    """Mean and sample standard deviation over seeds of each setting of a ``seed=...`` sweep.

    A setting is a run's overrides without ``seed``; ``SEED_FIGURES`` are
    averaged. One asynchronous run's accuracy swings by several points, so
    comparisons of strategies are made on these means.
    """
    keys = [key for key in _override_keys(runs) if key != "seed"]
    settings: dict[str, list[Run]] = {}
    for run in runs:
        key = ",".join(f"{k}={run.setting(k)}" for k in keys)
        settings.setdefault(key, []).append(run)
    table = []
    for key, members in settings.items():
        row: dict = {"setting": key, "seeds": len(members)}
        for name in SEED_FIGURES:
            values = np.array([_figure(run, name) for run in members], dtype=float)
            row[f"{name}_mean"] = float(values.mean())
            row[f"{name}_std"] = float(values.std(ddof=1)) if len(values) > 1 else float("nan")
        table.append(row)
    return table


def _figure(run: Run, name: str) -> float:
    if name == "late_accuracy":
        return run.late_accuracy()
    if name == "mean_round_s":
        return run.mean_round_s()
    if name.startswith("mean_group_"):
        return run.mean_of(name)
    value = run.summary.get(name)
    return float("nan") if value is None else float(value)


def _write_seed_table(runs: list[Run], path: Path) -> Path:
    table = seed_summary(runs)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    return path


def _accuracy_axes(axes: plt.Axes, target: float | None) -> None:
    if target is not None:
        axes.axhline(target, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("virtual time (s)")
    axes.set_ylabel("global test accuracy")
    axes.grid(alpha=0.3)


def _save(figure: plt.Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


class SweepPlot(Callback):
    """Hydra callback: overlay a multirun's runs when it ends."""

    def on_multirun_end(self, config: DictConfig, **kwargs: object) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        if run_dirs(sweep_dir):
            for path in plot_sweep(sweep_dir):
                print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a run directory or a sweep directory")
    args = parser.parse_args(argv)
    if any((args.directory / name).is_file() for name in METRICS_FILES):
        print(f"wrote {plot_run(args.directory)}")
    else:
        for path in plot_sweep(args.directory):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
