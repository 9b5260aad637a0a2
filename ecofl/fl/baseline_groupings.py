"""The baselines' groupings, beside Eco-FL's (:mod:`ecofl.fl.grouping`): FedAT's latency tiers,
Astraea's mediators, FedAvg's one group and FedAsync's singletons.

Each returns a :class:`~ecofl.fl.grouping.Grouping`, so the event loop runs
every strategy through the same group rounds (``ecofl.fl.strategies``).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from scipy.stats import entropy

from ecofl.errors import UserError
from ecofl.fl.grouping import Grouping, as_arrays, kmeans_centres


def latency_tiers(homes: Sequence[int], latencies: Mapping[int, float], num_tiers: int, seed: int) -> Grouping:
    """FedAT's tiers (Chai et al. SC'21, §4 "tiering"): clients grouped by profiled response latency, no data term.

    K-means on latency (Eco-FL §5.2's clustering), every home in its nearest
    tier; tiers are numbered fastest first, the order FedAT's weights use.
    """
    ids = np.array(sorted(homes), dtype=int)
    lat = np.array([latencies[h] for h in ids], dtype=float)
    labels, centres = kmeans_centres(lat, num_tiers, seed)
    return Grouping(
        groups=tuple(tuple(int(h) for h in ids[labels == t]) for t in range(len(centres))),
        centres=tuple(float(c) for c in centres),
        waiting=(),
    )


def kl_to_uniform(hists: np.ndarray) -> np.ndarray:
    """KL divergence D_KL(P || P_u) (natural log) of each row's label distribution P to the uniform P_u."""
    hists = np.atleast_2d(np.asarray(hists, dtype=float))
    uniform = np.ones(hists.shape[-1])
    return entropy(hists, uniform, axis=-1)


KL_TIE = 1e-12  # Astraea: divergences this close (relative) are a tie, broken by the lower home id


def astraea_mediators(
    homes: Sequence[int],
    latencies: Mapping[int, float],
    label_hists: Mapping[int, np.ndarray],
    capacity: int,
) -> Grouping:
    """Astraea's mediators (Duan et al., "Astraea: Self-balancing Federated Learning ...", ICCD'19, and
    "Self-Balancing Federated Learning With Global Imbalanced Data in Mobile Systems", TPDS'21:
    mediator-based multi-client rescheduling).

    Greedy, one mediator at a time: an empty mediator m repeatedly takes the
    unassigned client k that minimises D_KL(P_m + P_k || P_u), the KL divergence
    of the label distribution of its clients with k added to the uniform
    distribution, until it holds ``capacity`` (gamma) clients or none is left;
    then the next mediator starts. No latency term. Ties go to the lower home
    id, within a relative tolerance of :data:`KL_TIE` (divergences of mirrored
    histograms, equal in exact arithmetic, differ in their last bits). The
    label histograms are the raw counts each home reports (Astraea's z-score
    data augmentation, which would change them first, is left out).
    The centres are the mediators' mean latencies (for reporting and the round
    deadline only).
    """
    if capacity < 1:
        raise UserError(f"a mediator holds at least one client, got capacity {capacity}")
    ids, lat, hists = as_arrays(homes, latencies, label_hists)
    unassigned = list(range(len(ids)))
    mediators: list[list[int]] = []
    while unassigned:
        members: list[int] = []
        labels = np.zeros(hists.shape[1])
        while unassigned and len(members) < capacity:
            divergence = kl_to_uniform(labels[None, :] + hists[unassigned])
            best = divergence.min()
            first_best = int(np.flatnonzero(divergence <= best + KL_TIE * max(1.0, abs(best)))[0])
            index = unassigned.pop(first_best)
            members.append(index)
            labels += hists[index]
        mediators.append(members)
    return Grouping(
        groups=tuple(tuple(int(h) for h in sorted(ids[m])) for m in mediators),
        centres=tuple(float(lat[m].mean()) for m in mediators),
        waiting=(),
    )


def single_group(homes: Sequence[int], latencies: Mapping[int, float]) -> Grouping:
    """FedAvg: every home in one group."""
    ids = tuple(sorted(int(h) for h in homes))
    return Grouping(groups=(ids,), centres=(float(np.mean([latencies[h] for h in ids])),), waiting=())


def singletons(homes: Sequence[int], latencies: Mapping[int, float]) -> Grouping:
    """FedAsync: every home its own group."""
    ids = sorted(int(h) for h in homes)
    return Grouping(
        groups=tuple((h,) for h in ids), centres=tuple(float(latencies[h]) for h in ids), waiting=()
    )
