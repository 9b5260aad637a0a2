"""Label-skewed partitions: k-class shards, RLG-IID and RLG-NIID (Eco-FL §6.1).

Eco-FL §6.1 gives every client "samples only from two random classes" (the
FedAvg pathological non-IID split) and, for its grouping experiments, places
clients in response-latency groups (RLG) so that each group's clients
together hold all 10 classes (RLG-IID) or only 3 classes (RLG-NIID).

FedAvg builds its split by sorting by label into 2N shards and dealing two
shards per client; a client can then get two shards of the same class, so
"exactly k classes" is not guaranteed. Here the construction is exact and
has two steps:

1. :func:`assign_classes` chooses which classes each holder (client or
   group) gets: exactly ``per_holder`` distinct classes each, every class to
   at least one holder. How many holders a class gets (its demand) is
   near-proportional to its number of samples, so client sizes stay even on
   imbalanced data, and capped by the samples available (a holder must get
   at least one sample of each of its classes). Each holder in turn takes
   the classes of highest remaining demand, ties broken at random: this
   greedy choice of the largest column sums completes a 0/1 matrix with the
   given row and column sums whenever one exists (Ryser 1957), and with all
   row sums equal to k one exists as soon as no demand exceeds the number
   of holders.
2. :func:`share_out` deals each class's samples, shuffled, in near-equal
   parts to the clients holding it, so every sample lands in exactly one
   client and every client holds at least one sample of each of its classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ecofl.errors import UserError


def class_demands(
    rng: np.random.Generator, weights: np.ndarray, total: int, caps: np.ndarray
) -> np.ndarray:
    """How many holders get each class: ``total`` in all, near-proportional to ``weights``.

    Every class gets at least 1 and at most its cap (water-filling: what a
    capped class cannot take goes to the others in proportion; the last
    units go to the largest remainders, ties broken at random).
    """
    count = len(weights)
    if total < count or caps.min() < 1 or caps.sum() < total:
        raise UserError(
            f"cannot share {count} classes out as {total} (holder, class) pairs: a class goes to "
            f"at least 1 and at most {caps.tolist()} holders (no more clients than its samples); "
            "use fewer clients or fewer classes per client"
        )
    demand = np.ones(count, dtype=np.int64)
    while (left := total - int(demand.sum())) > 0:
        weight = np.where(demand < caps, weights, 0).astype(float)
        ideal = left * weight / weight.sum()
        add = np.minimum(np.floor(ideal).astype(np.int64), caps - demand)
        if add.sum() == 0:  # every ideal share is below one: the largest remainders get one each
            order = np.lexsort((rng.random(count), -ideal))
            add[order[:left]] = 1
        demand += add
    return demand


def assign_classes(
    rng: np.random.Generator,
    num_holders: int,
    per_holder: int,
    classes: np.ndarray,
    weights: np.ndarray,
    caps: np.ndarray | None = None,
) -> list[np.ndarray]:
    """Give each holder ``per_holder`` distinct classes; every class is used.

    Class ``classes[j]`` goes to about ``weights[j]``-proportionally many
    holders (:func:`class_demands`), at most ``caps[j]`` and at most every
    holder.
    """
    count = len(classes)
    if not 1 <= per_holder <= count or num_holders * per_holder < count:
        raise UserError(
            f"cannot give {num_holders} holders {per_holder} of {count} classes each "
            "so that every class is used"
        )
    limit = np.full(count, num_holders) if caps is None else np.minimum(caps, num_holders)
    demand = class_demands(rng, np.asarray(weights, dtype=float), num_holders * per_holder, limit)
    chosen_sets = []
    for _ in range(num_holders):
        order = np.argsort(-(demand + rng.random(count)))  # by demand; random among equals
        chosen = order[:per_holder]
        demand[chosen] -= 1
        chosen_sets.append(np.sort(classes[chosen]))
    return chosen_sets


def share_out(
    labels: np.ndarray, client_classes: Sequence[np.ndarray], rng: np.random.Generator
) -> list[np.ndarray]:
    """Deal every class's samples in near-equal shuffled parts to the clients holding it."""
    chunks: list[list[np.ndarray]] = [[] for _ in client_classes]
    for label in np.unique(labels):
        holders = [i for i, held in enumerate(client_classes) if label in held]
        samples = rng.permutation(np.flatnonzero(labels == label))
        assert len(samples) >= len(holders), "class demands are capped by class sizes"
        for holder, part in zip(rng.permutation(holders), np.array_split(samples, len(holders))):
            chunks[holder].append(part)
    return [np.sort(np.concatenate(parts)) for parts in chunks]


def shards(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` classes (Eco-FL §6.1: two random classes)."""
    classes, sizes = np.unique(labels, return_counts=True)
    if classes_per_client > len(classes):
        raise UserError(f"classes_per_client={classes_per_client} exceeds the {len(classes)} classes")
    if num_clients * classes_per_client < len(classes):
        raise UserError(
            f"{num_clients} clients with {classes_per_client} classes each cannot hold all "
            f"{len(classes)} classes; use at least {math.ceil(len(classes) / classes_per_client)} clients"
        )
    client_classes = assign_classes(rng, num_clients, classes_per_client, classes, sizes, caps=sizes)
    return share_out(labels, client_classes, rng)


def latency_groups(
    labels: np.ndarray,
    groups: np.ndarray,
    classes_per_client: int,
    classes_per_group: int | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """RLG-IID (``classes_per_group=None``) or RLG-NIID partitions (Eco-FL §6.1).

    ``groups[i]`` is client i's response-latency group. RLG-IID: every group
    holds all classes. RLG-NIID: each group holds exactly ``classes_per_group``
    classes, and the groups together hold every class. Within a group, each
    client holds ``classes_per_client`` of the group's classes where possible;
    a group with too few clients to cover its classes that way gives each
    client ``ceil(group classes / group size)`` classes instead. Each class's
    samples are shared out among all clients, of every group, holding it;
    so that each of them gets at least one, a group gives a class to at most
    as many clients as its equal share of that class's samples.
    """
    classes, sizes = np.unique(labels, return_counts=True)
    group_ids = np.unique(groups)
    if classes_per_group is None:
        group_classes = [classes] * len(group_ids)
    else:
        if not 1 <= classes_per_group <= len(classes):
            raise UserError(
                f"classes_per_group must be between 1 and {len(classes)}, got {classes_per_group}"
            )
        if len(group_ids) * classes_per_group < len(classes):
            raise UserError(
                f"{len(group_ids)} groups of {classes_per_group} classes cannot hold all "
                f"{len(classes)} classes; need groups * classes_per_group >= {len(classes)}"
            )
        group_classes = assign_classes(rng, len(group_ids), classes_per_group, classes, sizes)
    groups_holding = np.zeros(len(classes), dtype=np.int64)
    for held in group_classes:
        groups_holding[np.searchsorted(classes, held)] += 1
    client_classes: list[np.ndarray] = [classes[:0]] * len(groups)
    for group, held in zip(group_ids, group_classes):
        members = np.flatnonzero(groups == group)
        per_client = min(len(held), max(classes_per_client, math.ceil(len(held) / len(members))))
        at = np.searchsorted(classes, held)
        fair_share = sizes[at] // groups_holding[at]  # samples of each class this group may use
        chosen_sets = assign_classes(rng, len(members), per_client, held, sizes[at], caps=fair_share)
        for member, chosen in zip(members, chosen_sets):
            client_classes[member] = chosen
    return share_out(labels, client_classes, rng)
