"""One sweep run twice, before and after a change: each setting's figures side by side (docs/RESULTS.md).

    python -m simulations.before_after OLD_SWEEP NEW_SWEEP --targets 0.6 0.7 --out docs/results/NAME

Settings are matched by the overrides that vary over both sweeps together
(``strategy=fedat``; ``partition=rlg_iid,strategy=fedat`` where only the new
sweep has RLG-IID, whose rows then have no "before"), and within a setting
only the seeds both sweeps ran are compared. Per setting, over those seeds:
late accuracy, time to each target, global updates, stragglers dropped, and
the check of the round-closing rule (:func:`early_closes`). Writes
``<out>_before_after.csv``, prints the table in Markdown and names any
setting that only one sweep has.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from simulations.compare import load_sweep, setting_label, settings_of, time_to_accuracy, varying_keys
from simulations.plot import Run


def early_closes(run: Run) -> tuple[int, int] | None:
    """(rounds with a late home, how many of them closed before their deadline), or None for rows without times.

    A synchronous round closes when every sampled home has replied, or at its
    deadline: one with a straggler must close at the deadline, not at its last
    on-time reply (a server cannot know the missing home will not come).
    """
    timed = [r for r in run.rows if r.get("deadline_s") is not None and r.get("round_closed_s") is not None]
    if not timed:
        return None
    late = [r for r in timed if r.get("stragglers", 0) > 0]
    return len(late), sum(r["round_closed_s"] < r["deadline_s"] - 1e-9 for r in late)


def figures(runs: list[Run], targets: list[float]) -> dict:
    """One setting's figures over its seeds (``checked``: how many of them carry round times)."""
    row: dict = {"seeds": len(runs), "late_accuracy": float(np.mean([run.late_accuracy() for run in runs])),
                 "updates": float(np.mean([run.summary["updates"] for run in runs])),
                 "stragglers": float(np.mean([run.summary["stragglers_total"] for run in runs]))}
    for target in targets:
        reached = [t for t in (time_to_accuracy(run, target) for run in runs) if t is not None]
        row[f"reached_{target}"] = len(reached)
        row[f"mean_s_{target}"] = float(np.mean(reached)) if reached else None
    checks = [c for c in map(early_closes, runs) if c is not None]
    row["checked"] = len(checks)
    row["late_rounds"] = sum(c[0] for c in checks)
    row["early_closes"] = sum(c[1] for c in checks)
    return row


def _by_seed(runs: list[Run]) -> dict[str | None, Run]:
    return {run.setting("seed"): run for run in runs}


def before_after(before: list[Run], after: list[Run], targets: list[float]) -> list[dict]:
    """Per setting of ``after``: {"setting", "strategy", "before": figures or None, "after": figures}.

    Where both sweeps have the setting, both sides cover only the seeds both ran.
    """
    keys = varying_keys(before + after)
    old = settings_of(before, keys)
    rows = []
    for name, runs in settings_of(after, keys).items():
        new_seeds, old_seeds = _by_seed(runs), _by_seed(old.get(name, []))
        common = [seed for seed in new_seeds if seed in old_seeds] or list(new_seeds)
        rows.append({"setting": name, "strategy": runs[0].setting("strategy"),
                     "before": figures([old_seeds[s] for s in common], targets) if name in old else None,
                     "after": figures([new_seeds[s] for s in common], targets)})
    return rows


def unmatched(before: list[Run], after: list[Run]) -> list[str]:
    """Settings that only one of the sweeps has, each with the sweep that has it."""
    keys = varying_keys(before + after)
    old, new = settings_of(before, keys), settings_of(after, keys)
    return [f"{name} (before only)" for name in old if name not in new] + \
        [f"{name} (after only)" for name in new if name not in old]


def _pair(row: dict, show: Callable[[dict], str]) -> str:
    before = "-" if row["before"] is None else show(row["before"])
    return f"{before} → {show(row['after'])}"


def _time(target: float) -> Callable[[dict], str]:
    def show(f: dict) -> str:
        mean = f[f"mean_s_{target}"]
        return f"{'-' if mean is None else f'{mean:.1f}'} ({f[f'reached_{target}']}/{f['seeds']})"
    return show


def _closes(f: dict) -> str:
    return "-" if not f["checked"] else f"{f['early_closes']} of {f['late_rounds']}"


def markdown(rows: list[dict], targets: list[float]) -> str:
    """The before → after table; time to a target as mean virtual s (seeds reaching it / seeds)."""
    head = ["setting", "seeds", "late accuracy", *(f"{t:.0%}: s (seeds)" for t in targets), "global updates",
            "stragglers", "late rounds closed early"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for row in rows:
        cells = [setting_label(row["setting"], row["strategy"]), str(row["after"]["seeds"]),
                 _pair(row, lambda f: f"{f['late_accuracy']:.3f}"), *(_pair(row, _time(t)) for t in targets),
                 _pair(row, lambda f: f"{f['updates']:.0f}"),
                 _pair(row, lambda f: f"{f['stragglers']:.0f}"), _pair(row, _closes)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="the sweep before the change (runs under */metrics.json)")
    parser.add_argument("after", type=Path, help="the same sweep after it")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.6, 0.7])
    parser.add_argument("--out", type=Path, required=True, help="prefix of the file written")
    args = parser.parse_args(argv)
    before, after = load_sweep(args.before), load_sweep(args.after)
    rows = before_after(before, after, args.targets)
    path = args.out.parent / f"{args.out.name}_before_after.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        fields = list(rows[0]["after"])
        writer.writerow(["setting", "strategy", *(f"before_{f}" for f in fields), *(f"after_{f}" for f in fields)])
        for row in rows:
            before_figures = row["before"] or {}
            writer.writerow([row["setting"], row["strategy"], *(before_figures.get(f) for f in fields),
                             *(row["after"][f] for f in fields)])
    print(f"wrote {path}")
    for name in unmatched(before, after):
        print(f"unmatched setting: {name}", file=sys.stderr)
    print(markdown(rows, args.targets))


if __name__ == "__main__":
    main()
