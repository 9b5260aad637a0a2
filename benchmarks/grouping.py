"""Grouping benchmark: label balance vs group round latency of Eco-FL's grouping (Eco-FL Fig. 9, no training).

Eco-FL's grouping (eq. 4, :func:`ecofl.fl.grouping.initial_grouping`) trades
the label balance of its groups (mean JS divergence of a group's labels to
uniform, lower is better) against how long a group round takes (the expected
slowest of ``k`` sampled homes, :func:`ecofl.fl.metrics.expected_round_latency`),
through lambda and the latency threshold RT. This measures both, without
training, on the setting of Figs. 8-9: 300 homes on Fashion-MNIST, RLG-NIID
(each response-latency group holds 3 classes), the paper's latency model,
5 groups, k = 4; averaged over ``--seeds`` (each seed draws latencies,
partition and K-means anew). Beside it:

* FedAT's latency tiers and Astraea's mediators (greedy KL, capacity
  homes / groups; the paper's extreme cases, lambda = 0 and lambda = infinity);
* the *preference* reading of §5.2 that an earlier version of this project
  used (a group takes only homes whose cost it raises least among all
  groups), kept here as the reference the paper's turn-taking is compared
  with; each setting is compared side by side on the same homes.

    .venv/bin/python benchmarks/grouping.py [--seeds 3]

writes benchmarks/results/grouping.json and the measured section of docs/grouping.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402
from client.federation import federation  # noqa: E402
from ecofl.fl.federation_setup import FederationSetup  # noqa: E402
from ecofl.fl.baseline_groupings import astraea_mediators, latency_tiers  # noqa: E402
from ecofl.fl.grouping import (  # noqa: E402
    CostTable,
    Grouping,
    derive_rt,
    initial_grouping,
    js_to_uniform,
    kmeans_centres,
)
from ecofl.fl.metrics import group_stats  # noqa: E402

HOMES, GROUPS, ROUND_SIZE = 300, 5, 4
RT_SCALES = (1.0, 2.0, 3.0, 4.0, 6.0)
LAMBDAS = (0.0, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)


def preference_grouping(
    homes: Sequence[int], latencies: Mapping[int, float], hists: Mapping[int, np.ndarray],
    num_groups: int, rt: float, lam: float, seed: int,
) -> Grouping:
    """The preference reading: in its turn a group takes its cheapest home among those that prefer it.

    A home prefers the feasible group whose cost it raises least:
    |L_s - L_n| / RT + lambda * (JS(pi_s + pi_n) - JS(pi_s)).
    """
    ids = np.array(sorted(homes))
    lat = np.array([latencies[h] for h in ids])
    H = np.stack([hists[h] for h in ids])
    _, centres = kmeans_centres(lat, num_groups, seed)
    table = CostTable(centres, lat, H, rt, lam)
    g = len(centres)
    sums = np.zeros((g, H.shape[1]))
    members: list[list[int]] = [[] for _ in range(g)]
    unassigned = np.arange(len(ids))
    idle, turn = 0, 0
    while unassigned.size and idle < g:
        cost = table.costs(sums, unassigned)
        preferred = np.argmin(cost - lam * js_to_uniform(sums)[:, None], axis=0)
        mine = (preferred == turn) & np.isfinite(cost[turn])
        if mine.any():
            candidates = np.flatnonzero(mine)
            pick = candidates[np.argmin(cost[turn, candidates])]
            members[turn].append(int(ids[unassigned[pick]]))
            sums[turn] += H[unassigned[pick]]
            unassigned = np.delete(unassigned, pick)
            idle = 0
        else:
            idle += 1
        turn = (turn + 1) % g
    return Grouping(tuple(tuple(sorted(m)) for m in members), tuple(float(c) for c in centres),
                    tuple(int(ids[i]) for i in unassigned))


def homes_of(seed: int) -> tuple[dict[int, float], dict[int, np.ndarray]]:
    """Latencies at t = 0 and label histograms of the Fig. 8/9 federation drawn with ``seed``."""
    setup = FederationSetup(
        num_homes=HOMES, dataset={"name": "fashion_mnist"},
        partition={"scheme": "rlg-niid", "classes_per_client": 2, "num_groups": GROUPS, "classes_per_group": 3},
        latency={"kind": "paper", "num_homes": HOMES, "mean_s": 10.0, "std_s": 3.0, "seed": seed}, seed=seed,
    )
    fed = federation(setup.to_json())
    return ({h: float(fed.latency(h, 0.0)) for h in range(HOMES)},
            {h: fed.histograms[h].astype(float) for h in range(HOMES)})


def measure(grouping: Grouping, latencies: Mapping[int, float], hists: Mapping[int, np.ndarray]) -> dict:
    stats = group_stats(grouping, hists, latencies, ROUND_SIZE)
    fastest = int(np.argmin(grouping.centres))
    return {
        "mean_js": stats["mean_group_js"],
        "fastest_group_js": stats["group_js"][fastest],
        "mean_round_s": stats["mean_group_latency"],
        "smallest_group": min(stats["group_sizes"]),
        "waiting": stats["waiting"],
    }


def averaged(per_seed: list[dict]) -> dict:
    return {key: float(np.mean([m[key] for m in per_seed])) for key in per_seed[0]}


def run(seeds: int) -> dict:
    started = time.perf_counter()
    federations = [homes_of(seed) for seed in range(seeds)]
    rts = [derive_rt(list(lat.values()), GROUPS, seed) for seed, (lat, _) in enumerate(federations)]

    def over_seeds(make: Callable[[int, dict, dict, float], Grouping], scale: float = 1.0) -> dict:
        return averaged([measure(make(seed, lat, hists, scale * rts[seed]), lat, hists)
                         for seed, (lat, hists) in enumerate(federations)])

    result: dict = {
        "homes": HOMES, "groups": GROUPS, "round_size": ROUND_SIZE, "seeds": seeds,
        "derived_rt_s": rts,
        "fedat": over_seeds(lambda seed, lat, hists, rt: latency_tiers(range(HOMES), lat, GROUPS, seed)),
        "astraea": over_seeds(
            lambda seed, lat, hists, rt: astraea_mediators(range(HOMES), lat, hists, HOMES // GROUPS)),
        "settings": [],
    }
    for scale in RT_SCALES:
        for lam in LAMBDAS:
            row = {"rt_scale": scale, "lambda": lam}
            for name, grouping in (("turns", initial_grouping), ("preference", preference_grouping)):
                row[name] = over_seeds(
                    lambda seed, lat, hists, rt: grouping(range(HOMES), lat, hists, GROUPS, rt, lam, seed), scale)
            result["settings"].append(row)
            print(f"rt x{scale:g} lambda {lam:g}: turns JS {row['turns']['mean_js']:.3f} "
                  f"round {row['turns']['mean_round_s']:.2f} s; preference JS {row['preference']['mean_js']:.3f} "
                  f"round {row['preference']['mean_round_s']:.2f} s", flush=True)
    result["seconds"] = time.perf_counter() - started
    return result


def markdown(result: dict) -> str:
    settings = result["settings"]
    both_better = sum(r["turns"]["mean_js"] <= r["preference"]["mean_js"]
                      and r["turns"]["mean_round_s"] <= r["preference"]["mean_round_s"] for r in settings)
    f, a = result["fedat"], result["astraea"]
    lines = [
        f"{result['homes']} homes, Fashion-MNIST RLG-NIID, {result['groups']} groups, rounds of "
        f"{result['round_size']} homes; means over {result['seeds']} seeds (derived RT "
        f"{', '.join(f'{rt:.2f}' for rt in result['derived_rt_s'])} s). JS: mean group JS divergence "
        "to uniform labels (lower: more balanced); round: mean expected group round (s).",
        "",
        f"Baselines: FedAT's latency tiers JS {f['mean_js']:.3f} (fastest group {f['fastest_group_js']:.3f}), "
        f"round {f['mean_round_s']:.2f} s; Astraea's mediators (greedy KL, {HOMES // GROUPS} homes each) "
        f"JS {a['mean_js']:.3f}, "
        f"round {a['mean_round_s']:.2f} s.",
        "",
        f"Eco-FL's turn-taking (the paper's reading) is at least as good on both JS and round time as the "
        f"preference reading in {both_better} of {len(settings)} settings.",
        "",
        "| RT x | lambda | JS | fastest group JS | round (s) | smallest group | waiting | "
        "preference: JS | fastest JS | round (s) | smallest group |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in settings:
        t, p = r["turns"], r["preference"]
        lines.append(
            f"| {r['rt_scale']:g} | {r['lambda']:g} | {t['mean_js']:.3f} | {t['fastest_group_js']:.3f} | "
            f"{t['mean_round_s']:.2f} | {t['smallest_group']:.0f} | {t['waiting']:.0f} | {p['mean_js']:.3f} | "
            f"{p['fastest_group_js']:.3f} | {p['mean_round_s']:.2f} | {p['smallest_group']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "grouping.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "grouping.md")
    args = parser.parse_args(argv)
    result = run(args.seeds)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    replace_section(args.doc, table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
