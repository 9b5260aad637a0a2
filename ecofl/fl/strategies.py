"""Eco-FL and its baselines as policies over one event loop (Eco-FL §5-6; docs/architecture.md).

A policy answers four questions the loop asks: how to group the homes, whether
to re-group while running (Algorithm 1), how many homes a group round
samples, and how strongly a finished group model is mixed into the global
model (``alpha_t``). Everything else (virtual-time ordering, the
sample-weighted mean inside a group, FedProx in local training, rejection of
bad updates, checkpoints) is shared, so the comparison isolates the policy.

==============  ===============================  ==========  ====================  =========================
policy          groups                           re-groups   homes per group round  alpha_t
==============  ===============================  ==========  ====================  =========================
ecofl           eq. 4 greedy (latency + labels)  yes         homes_per_round        alpha * s(staleness)
ecofl_wo_dg     eq. 4 greedy                     no          homes_per_round        alpha * s(staleness)
fedavg          one group                        no          max_concurrent         1 (global = group model)
fedasync        every home alone                 no          1                      alpha * s(staleness)
fedat           K-means latency tiers            no          homes_per_round        FedAT tier weight
astraea         data-balanced groups             no          homes_per_round        alpha * s(staleness)
==============  ===============================  ==========  ====================  =========================

Notes on the baselines:

* **FedAvg**: one group whose rounds are synchronous; with one group nothing
  is ever stale and alpha_t = 1 makes the global model the round's weighted
  mean, i.e. plain FedAvg (FedProx when mu > 0) over ``max_concurrent``
  sampled homes per round.
* **FedAsync** (Xie et al. 2019): each home is a group of one; the loop's
  ``max_concurrent`` cap keeps at most that many homes training at once.
* **FedAT** (Chai et al. SC'21): tiers by latency, synchronous inside a
  tier, asynchronous across tiers. FedAT's global model is
  sum_i (T_{M+1-i} / T) w_i: the tier with the fewest updates gets the weight
  of the most-updated one. On this loop a tier's model is mixed in with
  ``alpha_t = min(1, alpha * M * T_{mirror(i)} / T)`` (M tiers, T_i = 1 +
  updates of tier i so far counting this one, so no tier weighs zero; mirror
  = the tier of opposite rank by update count), so slow tiers pull harder
  and equal counts give ``alpha``.
  FedAT uses no staleness function.
* **Astraea** (Duan et al.): groups ("mediators") balance label
  distributions with no regard to latency. Astraea trains a mediator's
  clients sequentially and averages mediators synchronously; here its groups
  are mixed asynchronously like Eco-FL's, so the comparison measures the
  grouping alone (its price shows as stragglers inside mixed-latency groups).

Only Eco-FL's groups are built with a latency threshold RT, so only Eco-FL
has a default round deadline (centre + RT, see ``ecofl.fl.loop_config.LoopConfig``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Mapping, Sequence

import numpy as np

from ecofl.fl.aggregation import staleness_factor
from ecofl.fl.grouping import (
    Grouping,
    data_balanced_groups,
    initial_grouping,
    latency_tiers,
    regroup,
    single_group,
    singletons,
)
from ecofl.fl.loop_config import LoopConfig


@dataclass(frozen=True)
class PolicySettings:
    """What a policy reads of the loop's settings (:class:`~ecofl.fl.loop_config.LoopConfig` fields)."""

    num_groups: int
    homes_per_round: int
    max_concurrent: int
    lam: float
    alpha: float
    staleness: str
    staleness_a: float
    staleness_b: float
    seed: int

    @classmethod
    def of(cls, config: LoopConfig) -> "PolicySettings":
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})


class Policy:
    """What the event loop asks a strategy; the defaults are Eco-FL's (§5)."""

    name = "ecofl"
    regroups = True
    uses_rt = True  # groups bounded by RT: rounds get the centre + RT deadline by default

    def __init__(self, settings: PolicySettings):
        self.settings = settings

    def group(self, homes: Sequence[int], latencies: Mapping[int, float], label_hists: Mapping[int, np.ndarray],
              rt: float) -> Grouping:
        s = self.settings
        return initial_grouping(homes, latencies, label_hists, s.num_groups, rt, s.lam, s.seed)

    def regroup(self, grouping: Grouping, latencies: Mapping[int, float], label_hists: Mapping[int, np.ndarray],
                rt: float) -> Grouping:
        """Algorithm 1, or the grouping unchanged for policies that do not re-group."""
        if not self.regroups:
            return grouping
        return regroup(grouping, latencies, label_hists, rt, self.settings.lam)

    def round_size(self) -> int:
        """How many homes a group round samples (fewer when the group is smaller)."""
        return self.settings.homes_per_round

    def mixing_weight(self, staleness: int, group: int, updates_per_group: Sequence[int]) -> float:
        """alpha_t for mixing ``group``'s model; ``updates_per_group`` counts this update already."""
        s = self.settings
        return s.alpha * staleness_factor(s.staleness, staleness, s.staleness_a, s.staleness_b)


class EcoFL(Policy):
    """Eco-FL (§5): eq. 4 grouping, dynamic re-grouping (Algorithm 1), FedAsync mixing of group models."""


class EcoFLWithoutDynamicGrouping(Policy):
    """Eco-FL with the initial grouping kept for the whole run (the paper's "w/o DG" ablation)."""

    name = "ecofl_wo_dg"
    regroups = False


class FedAvg(Policy):
    """FedAvg/FedProx: one synchronous group, the global model is each round's weighted mean."""

    name = "fedavg"
    regroups = False
    uses_rt = False

    def group(self, homes, latencies, label_hists, rt):
        return single_group(homes, latencies)

    def round_size(self):
        return self.settings.max_concurrent

    def mixing_weight(self, staleness, group, updates_per_group):
        return 1.0


class FedAsync(Policy):
    """FedAsync: every home its own group, mixed in as it finishes."""

    name = "fedasync"
    regroups = False
    uses_rt = False

    def group(self, homes, latencies, label_hists, rt):
        return singletons(homes, latencies)

    def round_size(self):
        return 1


class FedAT(Policy):
    """FedAT: latency tiers, tier models weighted towards the less-updated (slower) tiers."""

    name = "fedat"
    regroups = False
    uses_rt = False

    def group(self, homes, latencies, label_hists, rt):
        return latency_tiers(homes, latencies, self.settings.num_groups, self.settings.seed)

    def mixing_weight(self, staleness, group, updates_per_group):
        counts = np.asarray(updates_per_group, dtype=float) + 1.0  # no tier weighs zero before it updates
        by_count = np.argsort(counts, kind="stable")  # fewest updates first
        rank = int(np.flatnonzero(by_count == group)[0])
        mirror = counts[by_count[len(counts) - 1 - rank]]
        return float(min(1.0, self.settings.alpha * len(counts) * mirror / counts.sum()))


class Astraea(Policy):
    """Astraea's data-balanced groups, mixed asynchronously like Eco-FL's groups."""

    name = "astraea"
    regroups = False
    uses_rt = False

    def group(self, homes, latencies, label_hists, rt):
        return data_balanced_groups(homes, latencies, label_hists, self.settings.num_groups)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (EcoFL, EcoFLWithoutDynamicGrouping, FedAvg, FedAsync, FedAT, Astraea)
}


def make_policy(config: LoopConfig) -> Policy:
    """The policy ``config.strategy`` names (LoopConfig has checked the name), with the settings it reads."""
    return POLICIES[config.strategy](PolicySettings.of(config))
