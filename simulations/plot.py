"""Plots of simulation runs: one run, or the runs of a Hydra sweep overlaid.

    python -m simulations.plot outputs/2026-01-01/12-00-00_ecofl      # one run -> accuracy.png
    python -m simulations.plot multirun/2026-01-01/12-00-00           # a sweep -> sweep_accuracy.png,
                                                                      #   sweep.csv (+ sweep_lambda.png)

A run directory holds the event loop's ``metrics.json`` and ``summary.json``
and Hydra's ``.hydra/config.yaml``. A sweep's runs are overlaid as accuracy
vs virtual time (Eco-FL Figs. 7 and 8); when the runs differ in
``grouping.lambda`` a second figure shows, against lambda, the mean group JS
divergence, the mean group latency and the accuracy (Fig. 9). Multiruns call
:class:`SweepPlot` at their end (``hydra.callbacks`` in ``conf/config.yaml``).
"""

from __future__ import annotations

import argparse
import csv
import json
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
            rows=json.loads((path / "metrics.json").read_text()),
            summary=json.loads((path / "summary.json").read_text()),
            config=config,
        )

    @property
    def label(self) -> str:
        """The run's overrides (Hydra's sweep sub-directory name without its number), or its path."""
        name = self.path.name
        head, _, tail = name.partition("_")
        return tail if head.isdigit() and tail else name

    def curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(virtual time, accuracy) of the evaluated updates."""
        points = [(r[TIME], r[ACCURACY]) for r in self.rows if r.get(ACCURACY) is not None]
        if not points:
            return np.zeros(0), np.zeros(0)
        times, accuracies = zip(*points)
        return np.asarray(times, dtype=float), np.asarray(accuracies, dtype=float)

    def mean_of(self, column: str) -> float:
        values = [r[column] for r in self.rows if r.get(column) is not None]
        return float(np.mean(values)) if values else float("nan")

    def grouping_lambda(self) -> float | None:
        value = (self.config.get("grouping") or {}).get("lambda")
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
    runs = [Run.load(p.parent) for p in sorted(sweep_dir.glob("*/metrics.json"))]
    if not runs:
        raise FileNotFoundError(f"no runs (*/metrics.json) under {sweep_dir}")
    written = [_write_table(runs, sweep_dir / "sweep.csv")]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        axes.plot(*run.curve(), marker=".", label=run.label)  # a marker: a run evaluated once is still seen
    _accuracy_axes(axes, runs[0].summary.get("target_accuracy"))
    axes.legend(fontsize="small")
    written.append(_save(figure, sweep_dir / "sweep_accuracy.png"))
    lambdas = [run.grouping_lambda() for run in runs]
    if None not in lambdas and len(set(lambdas)) > 1:
        written.append(plot_lambda(runs, sweep_dir / "sweep_lambda.png"))
    return written


def plot_lambda(runs: list[Run], path: Path) -> Path:
    """Eco-FL Fig. 9: mean group JS divergence, mean group latency and final accuracy vs lambda."""
    order = sorted(runs, key=lambda run: run.grouping_lambda())
    lambdas = [run.grouping_lambda() for run in order]
    panels = [
        ("mean group JS divergence", [run.mean_of("mean_group_js") for run in order]),
        ("mean group round latency (s)", [run.mean_of("mean_group_latency") for run in order]),
        ("final test accuracy", [run.summary.get("final_accuracy") or float("nan") for run in order]),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (title, values) in zip(axes, panels):
        ax.plot(lambdas, values, marker="o")
        ax.set_xlabel("lambda")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    return _save(figure, path)


def _write_table(runs: list[Run], path: Path) -> Path:
    keys = sorted({k for run in runs for k, v in run.summary.items() if not isinstance(v, (dict, list))})
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "lambda", "mean_group_js", "mean_group_latency", *keys])
        for run in runs:
            writer.writerow([run.label, run.grouping_lambda(), run.mean_of("mean_group_js"),
                             run.mean_of("mean_group_latency"), *(run.summary.get(k) for k in keys)])
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
        if any(sweep_dir.glob("*/metrics.json")):
            for path in plot_sweep(sweep_dir):
                print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="a run directory or a sweep directory")
    args = parser.parse_args(argv)
    if (args.directory / "metrics.json").is_file():
        print(f"wrote {plot_run(args.directory)}")
    else:
        for path in plot_sweep(args.directory):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
