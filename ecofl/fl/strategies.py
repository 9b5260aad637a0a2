"""Eco-FL and its baselines as policies over one event loop (Eco-FL §5-6; docs/architecture.md).

A policy answers what the loop asks: how to group the homes, whether to
re-group while running (Algorithm 1), whether a group's rounds are
synchronous rounds that wait for their homes, how many homes a group round
samples, and how a finished group model makes the new global model.
Everything else (virtual-time order, the sample-weighted mean inside a
group, FedProx in local training, the round deadline, rejection of bad
updates, checkpoints) is shared, so the comparison isolates the policy.

===================  ===================================  =========  ===============  ==================================
policy               groups                               re-groups  homes per round  new global model
===================  ===================================  =========  ===============  ==================================
ecofl                eq. 4 greedy (latency + labels)      yes        homes_per_round  FedAsync mix, a = alpha s(t - tau)
ecofl_wo_dg          eq. 4 greedy                         no         homes_per_round  FedAsync mix, a = alpha s(t - tau)
fedavg               one group                            no         max_concurrent   the round's weighted mean
fedasync             every home alone                     no         1 (no deadline)  FedAsync mix, a = alpha s(t - tau)
fedat                K-means latency tiers                no         homes_per_round  sum_i T_(M+1-i) / T w_tier_i
astraea              greedy KL mediators, capacity gamma  no         homes_per_round  FedAsync mix, a = alpha s(t - tau)
fedat_equal_weights  K-means latency tiers                no         homes_per_round  mean of w_tier_i, 1/M each
===================  ===================================  =========  ===============  ==================================

Every policy with synchronous rounds (all but FedAsync) gets the same round
deadline, ``loop.round_deadline`` (:meth:`~ecofl.fl.loop_config.LoopConfig.round_deadline_s`;
default: the group's latency centre + RT on the virtual clock, later
replies are stragglers). s(t - tau) is FedAsync's staleness function of
Xie et al.'s staleness (:func:`ecofl.fl.aggregation.staleness`: 1 for an
update nobody overtook, unless ``loop.fresh_staleness`` = 0).

Notes on the baselines:

* **FedAvg** (McMahan et al.; FedProx when mu > 0): one group whose rounds
  are synchronous; alpha_t = 1 makes the global model the round's weighted
  mean over ``max_concurrent`` sampled homes. With the round deadline it
  drops stragglers, as the FedAvg baseline of the FedProx paper does.
* **FedAsync** (Xie, Koyejo and Gupta 2019, Algorithm 1): each home is a
  group of one, mixed in as it finishes with x_t = (1 - alpha_t) x_(t-1) +
  alpha_t x_new, alpha_t = alpha s(t - tau); the loop's ``max_concurrent``
  cap keeps at most that many homes training at once (Xie et al.'s
  scheduler).
* **FedAT** (Chai et al., SC'21): tiers by latency, synchronous rounds
  inside a tier, asynchronous across tiers. The server keeps every tier's
  latest model and after each tier update recomputes the global model as
  sum_i (T_(M+1-i) / T) w_tier_i (:func:`ecofl.fl.aggregation.fedat_tier_weights`:
  the least-updated tier weighs most). A tier enters the average with its
  first update: before it the tier has no model of its own, and counting it
  with the initial model and a count of 0 would give that placeholder the
  largest weight (the mirror of the most-updated tier), pinning the global
  model to the initial one until the slowest tier reported. The tiers train
  from the current global model; FedAT's staleness function is unused, and
  so is alpha. FedAT's model compression (polyline encoding) is left out: it
  changes bytes on the wire, which the latency models here do not charge.
  ``fedat_equal_weights`` is an ablation of it with every tier weighed 1/M.
* **Astraea** (Duan et al., ICCD'19; TPDS'21): mediators formed greedily by
  KL divergence of their label distribution to the uniform one, each up to
  gamma clients (:func:`ecofl.fl.baseline_groupings.astraea_mediators`), with gamma =
  ceil(homes / num_groups) so there are as many mediators as the other
  strategies have groups. Astraea reschedules the clients into mediators
  before its synchronisation rounds; with the homes' label histograms fixed
  (nothing here changes them) rescheduling again gives the same mediators,
  so they are formed once. Two parts of Astraea are left out: its z-score
  data augmentation (the histograms are the raw ones), and its training
  inside a mediator, where the mediator's clients train one after another
  on the model passed along. Here a mediator's round trains its sampled homes
  in parallel from the global model and averages them (the same
  intra-group round as Eco-FL), and mediator models are mixed into the
  global model asynchronously like Eco-FL's group models: as the Eco-FL
  paper does (§6.1: "for a fair comparison, we only compare with its client
  grouping method"), so the comparison measures the grouping. A sequential
  mediator round would last the sum of its homes' latencies instead of
  their maximum, so this Astraea is faster in virtual time than the paper's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import ceil
from typing import Mapping, Sequence

import numpy as np

from ecofl.fl.aggregation import fedasync_mix, fedat_tier_weights, staleness_factor, weighted_mean
from ecofl.fl.baseline_groupings import astraea_mediators, latency_tiers, single_group, singletons
from ecofl.fl.grouping import Grouping, initial_grouping, regroup
from ecofl.fl.loop_config import LoopConfig
from ecofl.weights import Weights


@dataclass(frozen=True)
class PolicySettings:
    """What a policy reads of the loop's settings (:class:`~ecofl.fl.loop_config.LoopConfig` fields)."""

    num_groups: int
    homes_per_round: int
    max_concurrent: int
    lam: float
    latency_units: str
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
    synchronous_rounds = True  # a group round waits for its homes (up to the round deadline)
    keeps_group_models = False  # the loop keeps each group's latest model for :meth:`aggregate`

    def __init__(self, settings: PolicySettings):
        self.settings = settings

    def group(self, homes: Sequence[int], latencies: Mapping[int, float], label_hists: Mapping[int, np.ndarray],
              rt: float) -> Grouping:
        s = self.settings
        return initial_grouping(homes, latencies, label_hists, s.num_groups, rt, s.lam, s.seed, s.latency_units)

    def regroup(self, grouping: Grouping, latencies: Mapping[int, float], label_hists: Mapping[int, np.ndarray],
                rt: float) -> Grouping:
        """Algorithm 1, or the grouping unchanged for policies that do not re-group."""
        if not self.regroups:
            return grouping
        return regroup(grouping, latencies, label_hists, rt, self.settings.lam, self.settings.latency_units)

    def round_size(self) -> int:
        """How many homes a group round samples (fewer when the group is smaller)."""
        return self.settings.homes_per_round

    def mixing_weight(self, staleness: int) -> float:
        """FedAsync's alpha_t = alpha * s(t - tau) for an update of staleness t - tau."""
        s = self.settings
        return s.alpha * staleness_factor(s.staleness, staleness, s.staleness_a, s.staleness_b)

    def aggregate(
        self,
        global_weights: Weights,
        group: int,
        group_model: Weights,
        staleness: int,
        updates_per_group: Sequence[int],
        group_models: Mapping[int, Weights],
    ) -> tuple[Weights, float]:
        """The global model after ``group``'s round and the weight its model got in it.

        ``updates_per_group`` counts this update already; ``group_models`` holds
        every group's latest model (this one included) when
        :attr:`keeps_group_models`, else nothing. The default is FedAsync's mix.
        """
        alpha_t = float(np.clip(self.mixing_weight(staleness), 0.0, 1.0))
        return fedasync_mix(global_weights, group_model, alpha_t), alpha_t


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

    def group(self, homes, latencies, label_hists, rt):
        return single_group(homes, latencies)

    def round_size(self):
        return self.settings.max_concurrent

    def mixing_weight(self, staleness):
        return 1.0


class FedAsync(Policy):
    """FedAsync: every home its own group, mixed in as it finishes (no rounds to wait for)."""

    name = "fedasync"
    regroups = False
    synchronous_rounds = False

    def group(self, homes, latencies, label_hists, rt):
        return singletons(homes, latencies)

    def round_size(self):
        return 1


class FedAT(Policy):
    """FedAT: latency tiers; the global model is the update-count-weighted average of every tier's latest model."""

    name = "fedat"
    regroups = False
    keeps_group_models = True

    def group(self, homes, latencies, label_hists, rt):
        return latency_tiers(homes, latencies, self.settings.num_groups, self.settings.seed)

    def aggregate(self, global_weights, group, group_model, staleness, updates_per_group, group_models):
        tiers = sorted(group_models)  # the tiers with a model, fastest first
        weights = fedat_tier_weights([updates_per_group[t] for t in tiers])
        return weighted_mean([group_models[t] for t in tiers], weights), float(weights[tiers.index(group)])


class FedATEqualWeights(FedAT):
    """An ablation, not a paper's baseline: FedAT with every tier's latest model weighed equally, 1/M.

    It separates FedAT's weighting (the least-updated, slowest tier weighs
    most) from its averaging of tier models of different ages
    (docs/RESULTS.md, Fig. 8 on RLG-IID).
    """

    name = "fedat_equal_weights"

    def aggregate(self, global_weights, group, group_model, staleness, updates_per_group, group_models):
        tiers = sorted(group_models)
        return weighted_mean([group_models[t] for t in tiers], [1] * len(tiers)), 1.0 / len(tiers)


class Astraea(Policy):
    """Astraea's mediators (greedy KL to uniform, capacity gamma), mixed asynchronously like Eco-FL's groups."""

    name = "astraea"
    regroups = False

    def group(self, homes, latencies, label_hists, rt):
        capacity = ceil(len(homes) / self.settings.num_groups)
        return astraea_mediators(homes, latencies, label_hists, capacity)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (EcoFL, EcoFLWithoutDynamicGrouping, FedAvg, FedAsync, FedAT, Astraea,
                              FedATEqualWeights)
}


def make_policy(config: LoopConfig) -> Policy:
    """The policy ``config.strategy`` names (LoopConfig has checked the name), with the settings it reads."""
    return POLICIES[config.strategy](PolicySettings.of(config))
