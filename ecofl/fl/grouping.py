"""Client grouping by response latency and label distribution (Eco-FL §5.2, eq. 4, Algorithm 1).

Eco-FL's cost of putting home ``n`` into group ``s`` is (eq. 4)

    COST(s, n) = |L_s - L_n| / RT + lambda * JS(pi_s + pi_n, uniform)

where ``L_s`` is the group's centre (the mean latency of its K-means cluster),
``pi_s + pi_n`` the label histogram of the group with the home added, and JS
the Jensen-Shannon *divergence* in base 2, which lies in [0, 1].

Two choices, documented because the paper leaves them open or because an
earlier version of this module read it otherwise:

* **Normalisation.** The paper adds seconds to a divergence. We divide the
  latency distance by RT, so both terms lie in [0, 1] for every feasible
  home (feasible means ``|L_s - L_n| <= RT``), and lambda weighs two
  dimensionless quantities whatever the time scale of the simulation.
  ``latency_units="seconds"`` takes the formula as printed instead (the
  distance in seconds): where latencies are seconds apart and RT exceeds a
  second, the latency term then outweighs the divergence by that factor.
* **Groups take turns, as the paper says.** "The Eco-FL server will pick a
  client with the smallest cost for each group in turn until nobody in the
  client pool can be associated with any group": group 0 takes its cheapest
  feasible home, then group 1, ..., round and round, so the groups fill
  evenly while they have feasible homes. An earlier version let a group take
  only homes that *preferred* it (raised its cost least), so that lambda = 0
  was exactly nearest-centre assignment. On the Fig. 8/9 setting (300 homes,
  RLG-NIID, RT 1-6x the derived one, lambda 0-300, 3 seeds;
  ``benchmarks/grouping.py``, ``docs/grouping.md``) taking turns is at least
  as good on both mean group JS divergence and expected group round in 33 of
  35 settings (within 3% of its JS in the other two), and its groups stay
  even (preference left the fastest group 9 of 300 homes at 3x RT,
  lambda = 100, seed 0).
  The paper's two extreme cases: with lambda = 0 the groups depend on
  latency alone (and are FedAT's tiers, nearest-centre assignment, when RT
  is below half the gap between neighbouring centres, so no home fits two
  groups); with lambda -> infinity and RT unbounded they depend on labels
  alone, as Astraea's mediators do, though not identically: the groups take
  turns and measure JS divergence, where Astraea fills one mediator after
  another by KL divergence (:func:`ecofl.fl.baseline_groupings.astraea_mediators`).

Homes that fit no group (farther than RT from every centre) *wait*: they are
dropped until re-grouping finds their latency back within range.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from ecofl.data.stats import js_to_uniform
from ecofl.errors import UserError

KMEANS_N_INIT = 10
#: Units of eq. 4's latency term |L_s - L_n|: RT (dimensionless, the default) or seconds (as the paper prints it).
LATENCY_UNITS = ("rt", "seconds")


@dataclass(frozen=True)
class Grouping:
    """Homes per group, each group's latency centre L_s (seconds), and the waiting homes."""

    groups: tuple[tuple[int, ...], ...]
    centres: tuple[float, ...]
    waiting: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.groups) != len(self.centres):
            raise ValueError(f"{len(self.groups)} groups but {len(self.centres)} centres")
        members = [h for g in self.groups for h in g] + list(self.waiting)
        if len(members) != len(set(members)):
            raise ValueError("a home appears twice in the grouping")

    def group_of(self, home: int) -> int | None:
        """The group ``home`` belongs to, or None when it waits."""
        for index, members in enumerate(self.groups):
            if home in members:
                return index
        return None

    def to_json(self) -> dict:
        return {
            "groups": [list(g) for g in self.groups],
            "centres": list(self.centres),
            "waiting": list(self.waiting),
        }

    @classmethod
    def from_json(cls, data: Mapping) -> "Grouping":
        return cls(
            groups=tuple(tuple(int(h) for h in g) for g in data["groups"]),
            centres=tuple(float(c) for c in data["centres"]),
            waiting=tuple(int(h) for h in data["waiting"]),
        )


def kmeans_centres(latencies: Sequence[float], num_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """K-means on latency (§5.2): cluster labels per home and centres L_s, sorted fastest first.

    ``num_groups`` is capped at the number of distinct latencies. The result
    is cached for the latest few inputs (RT's derivation and the grouping ask
    for the same clusters, which take seconds at 100,000 homes).
    """
    values = np.asarray(latencies, dtype=float)
    if values.size == 0:
        raise UserError("cannot group zero homes")
    if num_groups < 1:
        raise UserError(f"num_groups must be at least 1, got {num_groups}")
    labels, centres = _kmeans(values.tobytes(), num_groups, seed)
    return labels.copy(), centres.copy()


@lru_cache(maxsize=4)
def _kmeans(values_bytes: bytes, num_groups: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.cluster import KMeans  # here, not at import: a home's ClientApp imports this module and never clusters

    values = np.frombuffer(values_bytes, dtype=float)
    k = min(num_groups, len(np.unique(values)))
    model = KMeans(n_clusters=k, n_init=KMEANS_N_INIT, random_state=seed).fit(values.reshape(-1, 1))
    centres = np.array([values[model.labels_ == c].mean() for c in range(k)])
    order = np.argsort(centres, kind="stable")
    rank = np.empty(k, dtype=int)
    rank[order] = np.arange(k)
    return rank[model.labels_], centres[order]


def derive_rt(latencies: Sequence[float], num_groups: int, seed: int) -> float:
    """Default latency threshold RT: max(mean gap between adjacent K-means centres, largest home-to-centre distance).

    With it nobody waits in the initial grouping, and a home near the edge of
    its cluster may also join the neighbouring groups, where lambda decides
    between latency and label balance; a group's round then waits at most
    about as long as the next slower group's centre.
    """
    values = np.asarray(latencies, dtype=float)
    labels, centres = kmeans_centres(values, num_groups, seed)
    spread = float(np.abs(values - centres[labels]).max())
    gap = float(np.diff(centres).mean()) if len(centres) > 1 else 0.0
    return max(gap, spread, 1e-9)


class CostTable:
    """COST(s, n) of eq. 4 for every group and home, given the groups' current label sums."""

    def __init__(self, centres: np.ndarray, latencies: np.ndarray, hists: np.ndarray, rt: float, lam: float,
                 latency_units: str = "rt"):
        if not rt > 0:
            raise UserError(f"RT must be positive, got {rt}")
        if lam < 0:
            raise UserError(f"lambda must be non-negative, got {lam}")
        if latency_units not in LATENCY_UNITS:
            raise UserError(f"latency_units must be one of {', '.join(LATENCY_UNITS)}, got {latency_units!r}")
        self.distance = np.abs(centres[:, None] - latencies[None, :])  # groups x homes
        self.feasible = self.distance <= rt
        self.hists = hists
        self.lam = lam
        self.latency_unit = rt if latency_units == "rt" else 1.0

    def latency_term(self, groups: np.ndarray | int, homes: np.ndarray | int) -> np.ndarray | float:
        """Eq. 4's |L_s - L_n| in its units (over RT, or seconds) for ``groups`` x ``homes`` (index arrays as
        :func:`numpy.ix_` makes them, or single indices)."""
        return self.distance[groups, homes] / self.latency_unit

    def costs(self, group_sums: np.ndarray, homes: np.ndarray, groups: Sequence[int] | None = None) -> np.ndarray:
        """Costs of ``homes`` for ``groups`` (default: all), whose label sums are ``group_sums``; infeasible: +inf."""
        rows = np.arange(len(self.distance)) if groups is None else np.asarray(groups)
        cost = self.latency_term(*np.ix_(rows, homes))
        if self.lam > 0:
            union = group_sums[:, None, :] + self.hists[None, homes, :]
            cost = cost + self.lam * js_to_uniform(union.reshape(-1, union.shape[-1])).reshape(cost.shape)
        return np.where(self.feasible[np.ix_(rows, homes)], cost, np.inf)


def as_arrays(
    homes: Sequence[int], latencies: Mapping[int, float], label_hists: Mapping[int, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array(sorted(homes), dtype=int)
    missing = [h for h in ids if h not in latencies or h not in label_hists]
    if missing:
        raise UserError(f"no latency or label histogram for homes {missing[:10]}")
    lat = np.array([latencies[h] for h in ids], dtype=float)
    hists = np.stack([np.asarray(label_hists[h], dtype=float) for h in ids]) if len(ids) else np.zeros((0, 1))
    return ids, lat, hists


def initial_grouping(
    homes: Sequence[int],
    latencies: Mapping[int, float],
    label_hists: Mapping[int, np.ndarray],
    num_groups: int,
    rt: float,
    lam: float,
    seed: int,
    latency_units: str = "rt",
) -> Grouping:
    """Eco-FL's initial grouping (§5.2): K-means centres, then each group in turn takes its cheapest home (eq. 4).

    Only homes within RT of the group's centre are candidates; ties go to the
    lower home id. Groups with no candidate left skip their turn; homes no
    group can take wait.

    **Cost.** Asking every unassigned home at every turn costs O(homes^2).
    Homes with the same label histogram have the same label term, so among
    them a group's cheapest is its nearest: :class:`_NearestByHistogram`
    keeps, per group and distinct histogram, the feasible homes sorted by
    distance, and a turn compares one head per distinct histogram. The
    choice is exactly the one of comparing all homes (same costs, same
    ties; ``tests/test_grouping_scale.py`` checks it against that), at
    O(homes x distinct histograms): 45 histograms for 100,000 homes drawing
    equal shares of two classes each, but as many as homes when every home's
    counts differ (Dirichlet partitions), where it stays quadratic.
    """
    ids, lat, hists = as_arrays(homes, latencies, label_hists)
    _, centres = kmeans_centres(lat, num_groups, seed)
    table = CostTable(centres, lat, hists, rt, lam, latency_units)
    nearest = _NearestByHistogram(table, hists)
    g = len(centres)
    sums = np.zeros((g, hists.shape[1]))
    members: list[list[int]] = [[] for _ in range(g)]
    left = len(ids)
    idle_turns = 0
    turn = 0
    while left and idle_turns < g:
        index = nearest.cheapest(turn, sums[turn])
        if index is not None:
            members[turn].append(int(ids[index]))
            sums[turn] += hists[index]
            nearest.take(index)
            left -= 1
            idle_turns = 0
        else:
            idle_turns += 1
        turn = (turn + 1) % g
    return Grouping(
        groups=tuple(tuple(sorted(m)) for m in members),
        centres=tuple(float(c) for c in centres),
        waiting=tuple(int(i) for i in ids[nearest.unassigned()]),
    )


class _NearestByHistogram:
    """Each group's feasible unassigned homes, per distinct label histogram, nearest first (ties: lower index).

    :meth:`cheapest` is ``argmin`` of :meth:`CostTable.costs` over all
    unassigned homes, computed from one candidate per distinct histogram:
    the head of each (group, histogram) queue, kept current by :meth:`take`.
    """

    def __init__(self, table: CostTable, hists: np.ndarray):
        self.table = table
        self.distinct, kind = np.unique(hists, axis=0, return_inverse=True)
        self.kind = kind.reshape(-1)
        self.assigned = np.zeros(len(hists), dtype=bool)
        groups, kinds = len(table.distance), len(self.distinct)
        self.queues: list[list[np.ndarray]] = []  # [group][kind] -> feasible homes by (distance, index)
        for group in range(groups):
            feasible = np.flatnonzero(table.feasible[group])
            order = feasible[np.lexsort((feasible, table.distance[group, feasible]))]
            grouped = order[np.argsort(self.kind[order], kind="stable")]  # by kind, each kind still in order
            bounds = np.searchsorted(self.kind[grouped], np.arange(kinds + 1))
            self.queues.append([grouped[bounds[k]:bounds[k + 1]] for k in range(kinds)])
        self.position = np.zeros((groups, kinds), dtype=np.int64)  # of each queue's head
        self.head = np.array([[q[0] if len(q) else -1 for q in queues] for queues in self.queues], dtype=np.int64)

    def cheapest(self, group: int, group_sum: np.ndarray) -> int | None:
        """The home ``group`` takes at its turn (as :meth:`CostTable.costs` + ``argmin`` would), or None."""
        kinds = np.flatnonzero(self.head[group] >= 0)
        if not kinds.size:
            return None
        table = self.table
        label_term = table.lam * js_to_uniform(group_sum[None, :] + self.distinct[kinds]) if table.lam > 0 else None
        cost = table.latency_term(group, self.head[group, kinds])
        if label_term is not None:
            cost = cost + label_term
        best = cost.min()
        ties = np.flatnonzero(cost == best)
        return min(self._lowest_index_at(group, int(kinds[t]), best, None if label_term is None else label_term[t])
                   for t in ties)

    def _lowest_index_at(self, group: int, k: int, best: float, label_term: float | None) -> int:
        """The lowest index among kind ``k``'s unassigned homes whose cost equals ``best`` (a farther home can
        round to the nearest one's cost)."""
        queue = self.queues[group][k]
        table = self.table
        lowest = int(queue[self.position[group, k]])
        for index in queue[self.position[group, k] + 1:]:
            if self.assigned[index]:
                continue
            cost = table.latency_term(group, index)
            if label_term is not None:
                cost = cost + label_term
            if cost != best:
                break
            lowest = min(lowest, int(index))
        return lowest

    def take(self, index: int) -> None:
        """Assign home ``index``: every queue it heads moves on to its next unassigned home."""
        self.assigned[index] = True
        k = self.kind[index]
        for group in np.flatnonzero(self.head[:, k] == index):
            queue, at = self.queues[group][k], self.position[group, k]
            while at < len(queue) and self.assigned[queue[at]]:
                at += 1
            self.position[group, k] = at
            self.head[group, k] = queue[at] if at < len(queue) else -1

    def unassigned(self) -> np.ndarray:
        return np.flatnonzero(~self.assigned)


def regroup(
    grouping: Grouping,
    latencies: Mapping[int, float],
    label_hists: Mapping[int, np.ndarray],
    rt: float,
    lam: float,
    latency_units: str = "rt",
) -> Grouping:
    """Dynamic re-grouping, Eco-FL Algorithm 1.

    Every grouped home whose latency left its group's range (|L_s - L_n| > RT)
    moves to the feasible group of smallest COST (eq. 4), or waits when none
    fits; every waiting home whose latency now fits some group rejoins the
    cheapest one. Homes are handled in id order; centres stay the initial
    K-means centres, which define the groups' latency ranges.
    """
    homes = [h for g in grouping.groups for h in g] + list(grouping.waiting)
    ids, lat, hists = as_arrays(homes, latencies, label_hists)
    position = {int(h): i for i, h in enumerate(ids)}
    centres = np.asarray(grouping.centres, dtype=float)
    table = CostTable(centres, lat, hists, rt, lam, latency_units)
    members = [set(g) for g in grouping.groups]
    waiting = set(grouping.waiting)
    sums = np.stack([hists[[position[h] for h in g]].sum(axis=0) for g in members]) if members else None

    def place(home: int) -> int | None:
        cost = table.costs(sums, np.array([position[home]]))[:, 0]
        best = int(np.argmin(cost))
        return best if np.isfinite(cost[best]) else None

    for s, group in enumerate(grouping.groups):
        for home in group:
            if table.feasible[s, position[home]]:
                continue
            members[s].discard(home)
            sums[s] -= hists[position[home]]
            target = place(home)
            if target is None:
                waiting.add(home)
            else:
                members[target].add(home)
                sums[target] += hists[position[home]]
    for home in sorted(grouping.waiting):
        target = place(home)
        if target is not None:
            waiting.discard(home)
            members[target].add(home)
            sums[target] += hists[position[home]]
    return Grouping(
        groups=tuple(tuple(sorted(m)) for m in members),
        centres=grouping.centres,
        waiting=tuple(sorted(waiting)),
    )
