"""Model aggregation: the intra-group weighted mean, FedAsync's mixing and FedAT's tier weights.

Inside a group the round's models are averaged weighted by |D_c| (the
synchronous step of Eco-FL §5.1; FedProx's proximal term lives in local
training, ``ecofl.train``). Across groups the global model absorbs a finished
group model as FedAsync does (Xie, Koyejo and Gupta, "Asynchronous Federated
Optimization", 2019, Algorithm 1):
``x_t = (1 - a) x_(t-1) + a x_new`` with ``a = alpha * s(t - tau)``, where
tau is the global version the update started from and t the version it
produces, so an update nobody overtook has staleness 1 (:func:`staleness`).
FedAT (Chai et al., "FedAT: A High-Performance and Communication-Efficient
Federated Learning System with Asynchronous Tiers", SC'21) instead averages
the latest model of every tier with weights from the tiers' update counts
(:func:`fedat_tier_weights`).

Integer entries (batch-norm's ``num_batches_tracked``) are counters, not
parameters: averaging them is meaningless, so both the mean and the mix take
the largest value.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ecofl.errors import UserError
from ecofl.weights import Weights


STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


def _is_counter(array: np.ndarray) -> bool:
    return not np.issubdtype(array.dtype, np.inexact)


def weighted_mean(weight_lists: Sequence[Weights], num_samples: Sequence[int]) -> Weights:
    """Sample-weighted mean of several models (FedAvg/FedProx aggregation); integer entries take the max."""
    if not weight_lists:
        raise ValueError("nothing to average")
    if len(weight_lists) != len(num_samples):
        raise ValueError(f"{len(weight_lists)} models but {len(num_samples)} sample counts")
    coefficients = np.asarray(num_samples, dtype=np.float64)
    if (coefficients < 0).any() or coefficients.sum() <= 0:
        raise ValueError(f"sample counts must be non-negative with a positive sum: {list(num_samples)}")
    coefficients = coefficients / coefficients.sum()
    mean: Weights = []
    for entries in zip(*weight_lists):
        first = entries[0]
        if _is_counter(first):
            mean.append(np.max(np.stack(entries), axis=0).astype(first.dtype))
        else:
            total = sum(c * e.astype(np.float64) for c, e in zip(coefficients, entries))
            mean.append(np.asarray(total, dtype=first.dtype))
    return mean


def staleness(version_now: int, version_started: int, fresh: int = 1) -> int:
    """An update's staleness when it is applied to global version ``version_now``.

    Xie et al. (Algorithm 1, "Updater") apply the update started from x_tau as
    the t-th global update and weigh it by s(t - tau): t = version_now + 1, so
    an update nobody overtook has staleness 1. ``fresh`` is that staleness of a
    fresh update: 1 follows Xie et al., 0 counts only the updates applied
    in between (``LoopConfig.fresh_staleness``).
    """
    if fresh not in (0, 1):
        raise ValueError(f"a fresh update's staleness is 0 or 1, got {fresh}")
    if version_started > version_now:
        raise ValueError(f"an update cannot start from version {version_started} > {version_now}")
    return version_now - version_started + fresh


def staleness_factor(kind: str, staleness: int, a: float = 0.5, b: float = 4.0) -> float:
    """FedAsync's staleness function s(t - tau) (Xie et al. 2019, §5 "Staleness").

    constant: 1; polynomial: (t - tau + 1)^-a; hinge: 1 if t - tau <= b else
    1 / (a (t - tau - b) + 1). With Xie et al.'s staleness a fresh update
    (t - tau = 1) is mixed with alpha * s(1), e.g. alpha / sqrt(2) for the
    polynomial with a = 0.5.
    """
    if staleness < 0:
        raise ValueError(f"staleness cannot be negative, got {staleness}")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((staleness + 1) ** (-a))
    if kind == "hinge":
        return 1.0 if staleness <= b else float(1.0 / (a * (staleness - b) + 1.0))
    raise UserError(f"unknown staleness function {kind!r}; valid: {', '.join(STALENESS_FUNCTIONS)}")


def fedasync_mix(global_weights: Weights, new_weights: Weights, alpha_t: float) -> Weights:
    """FedAsync's update ``(1 - alpha_t) * global + alpha_t * new``; integer entries take the max."""
    if not 0.0 <= alpha_t <= 1.0:
        raise ValueError(f"mixing weight must lie in [0, 1], got {alpha_t}")
    mixed: Weights = []
    for g, n in zip(global_weights, new_weights, strict=True):
        if _is_counter(g):
            mixed.append(np.maximum(g, n).astype(g.dtype))
        else:
            value = (1.0 - alpha_t) * g.astype(np.float64) + alpha_t * n.astype(np.float64)
            mixed.append(value.astype(g.dtype))
    return mixed


def fedat_tier_weights(update_counts: Sequence[int]) -> np.ndarray:
    """FedAT's cross-tier weights (Chai et al. SC'21, §4 "weighted aggregation"): w = sum_i (T_(M+1-i) / T) w_i.

    ``update_counts`` holds T_i, the updates of each of the M tiers that have a
    model, in tier order fastest first; T is their sum. As in the paper, tier
    i's weight is the count of tier M+1-i, by position: the fastest tier takes
    the slowest tier's count and the slowest the fastest's, which lifts the
    slow tiers whenever the faster tiers have updated more (the usual case).
    Where a slower tier has made more updates than a faster one, this is
    still the paper's rule, by position and not by the ranks of the counts.
    Example: counts (4, 2, 1) -> weights (1/7, 2/7, 4/7); counts (2, 5, 1)
    -> (1/8, 5/8, 2/8).
    """
    counts = np.asarray(update_counts, dtype=float)
    if counts.ndim != 1 or counts.size == 0 or (counts < 1).any():
        raise ValueError(f"every tier in the average needs at least one update, got {list(update_counts)}")
    return counts[::-1] / counts.sum()


def is_finite_and_shaped(weights: Sequence[np.ndarray] | None, reference: Sequence[np.ndarray]) -> str | None:
    """Why ``weights`` cannot be aggregated with ``reference`` (count, shape, NaN/Inf), or None if it can."""
    if weights is None:
        return "no weights"
    if len(weights) != len(reference):
        return f"expected {len(reference)} arrays, got {len(weights)}"
    for index, (array, ref) in enumerate(zip(weights, reference)):
        array = np.asarray(array)
        if array.shape != ref.shape:
            return f"array {index}: expected shape {ref.shape}, got {array.shape}"
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            return f"array {index}: NaN or Inf values"
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            return f"array {index}: non-numeric dtype {array.dtype}"
    return None
