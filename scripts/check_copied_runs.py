"""Whether an archived old-clock run would run the same under ea16dd3's changes, so it may be copied, not re-run.

ea16dd3 changed three things that can move a Fig. 8 run (docs/RESULTS.md, "Fig. 7 again, on the round-closing
rule"): a synchronous round with a missing home closes at its deadline, FedAT weighs tier i by the update count of
tier M+1-i by position (it was by the ranks of the counts), and Astraea breaks KL ties within 1e-12 towards the
lower home id (it took ``argmin``'s pick). A run is unchanged by all three when

1. no round had a straggler or a failed home (every round closed with all its homes under either rule), by the
   metrics rows and by ``summary.json``'s totals, which also count rounds that brought no valid reply;
2. FedAT: at every update, every tier's weight by position equals its weight by rank (the counts recorded in
   ``metrics.json``, one update per row);
3. Astraea: the mediators formed with the tie rule equal those formed with ``argmin`` (rebuilt from the run's
   configuration: the dataset, its partition and the homes' latencies at t = 0).

    .venv/bin/python scripts/check_copied_runs.py docs/results/runs/fig8_niid_200s/*

prints one line per run and exits 1 if any run would change (to be made again, not copied).
"""

from __future__ import annotations

import json
import sys
from math import ceil
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.federation import Federation  # noqa: E402
from ecofl.fl.aggregation import fedat_tier_weights  # noqa: E402
from ecofl.fl.baseline_groupings import astraea_mediators, kl_to_uniform  # noqa: E402
from simulations.plot import read_metrics  # noqa: E402
from simulations.run import experiment  # noqa: E402


def weights_by_rank(update_counts: list[int]) -> np.ndarray:
    """FedAT's tier weights before ea16dd3: the tier of the i-th fewest updates takes the i-th largest count."""
    counts = np.asarray(update_counts, dtype=float)
    least_updated_first = sorted(range(counts.size), key=lambda t: (counts[t], -t))
    weights = np.empty_like(counts)
    for rank, tier in enumerate(least_updated_first):
        weights[tier] = counts[least_updated_first[-1 - rank]]
    return weights / counts.sum()


def mediators_by_argmin(hists: np.ndarray, capacity: int) -> list[list[int]]:
    """Astraea's greedy mediators before ea16dd3 (positions into ``hists``, sorted per mediator)."""
    unassigned, mediators = list(range(len(hists))), []
    while unassigned:
        members: list[int] = []
        labels = np.zeros(hists.shape[1])
        while unassigned and len(members) < capacity:
            index = unassigned.pop(int(np.argmin(kl_to_uniform(labels[None, :] + hists[unassigned]))))
            members.append(index)
            labels += hists[index]
        mediators.append(sorted(members))
    return mediators


def fedat_differences(rows: list[dict]) -> float:
    """The largest |weight by position - weight by rank| over every tier of every update."""
    counts: dict[int, int] = {}
    worst = 0.0
    for row in rows:
        counts[row["group"]] = counts.get(row["group"], 0) + 1
        tier_counts = [counts[t] for t in sorted(counts)]
        worst = max(worst, float(np.abs(fedat_tier_weights(tier_counts) - weights_by_rank(tier_counts)).max()))
    return worst


def astraea_unchanged(run: Path) -> bool:
    settings = OmegaConf.to_container(OmegaConf.load(run / ".hydra" / "config.yaml"), resolve=True)
    federation = Federation(experiment(settings).setup)
    homes = list(range(federation.setup.num_homes))
    hists = {h: np.asarray(federation.histograms[h], dtype=float) for h in homes}
    latencies = {h: federation.latency(h, 0.0) for h in homes}
    capacity = ceil(len(homes) / settings["grouping"]["num_groups"])
    with_tie_rule = [list(group) for group in astraea_mediators(homes, latencies, hists, capacity).groups]
    return with_tie_rule == mediators_by_argmin(np.stack([hists[h] for h in homes]), capacity)


def main(runs: list[str]) -> int:
    changed = 0
    for run in map(Path, runs):
        rows = [row for row in read_metrics(run) if row.get("group") is not None]
        strategy = OmegaConf.load(run / ".hydra" / "config.yaml").strategy.name
        summary = json.loads((run / "summary.json").read_text())  # also counts rounds without a valid reply (no row)
        dropped = max(sum(row["stragglers"] + row["failed"] for row in rows),
                      summary["stragglers_total"] + summary["failed_total"])
        verdict = [f"{len(rows)} updates, {dropped} stragglers or failed homes"]
        unchanged = dropped == 0
        if strategy == "fedat":
            difference = fedat_differences(rows)
            verdict.append(f"tier weights by position - by rank: at most {difference:g}")
            unchanged &= difference == 0.0
        if strategy == "astraea":
            same = astraea_unchanged(run)
            verdict.append("mediators " + ("the same" if same else "differ") + " with the tie rule")
            unchanged &= same
        print(f"{run.name}: {'unchanged' if unchanged else 'CHANGED'} ({'; '.join(verdict)})")
        changed += not unchanged
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
