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
   at least one holder, all classes used equally often (within one). Class
   demands are balanced integers; each holder in turn takes the classes of
   highest remaining demand, ties broken at random. That greedy choice of
   the largest column sums always completes a 0/1 matrix with the given row
   and column sums when one exists (Gale-Ryser), and balanced demands of at
   most the number of holders always admit one.
2. :func:`share_out` deals each class's samples, shuffled, in near-equal
   parts to the clients holding it, so every sample lands in exactly one
   client and every client holds at least one sample of each of its classes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ecofl.errors import UserError


def assign_classes(
    rng: np.random.Generator, num_holders: int, per_holder: int, classes: np.ndarray
) -> list[np.ndarray]:
    """Give each holder ``per_holder`` distinct classes; every class is used, evenly."""
    count = len(classes)
    total = num_holders * per_holder
    if not 1 <= per_holder <= count or total < count:
        raise UserError(
            f"cannot give {num_holders} holders {per_holder} of {count} classes each "
            "so that every class is used"
        )
    demand = np.full(count, total // count)
    demand[rng.choice(count, total % count, replace=False)] += 1
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
        if len(samples) < len(holders):
            raise UserError(
                f"class {label} has {len(samples)} samples but {len(holders)} clients "
                "must hold it; use fewer clients or fewer classes per client"
            )
        for holder, part in zip(rng.permutation(holders), np.array_split(samples, len(holders))):
            chunks[holder].append(part)
    return [np.sort(np.concatenate(parts)) for parts in chunks]


def shards(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Each client holds exactly ``classes_per_client`` classes (Eco-FL §6.1: two random classes)."""
    classes = np.unique(labels)
    if classes_per_client > len(classes):
        raise UserError(f"classes_per_client={classes_per_client} exceeds the {len(classes)} classes")
    if num_clients * classes_per_client < len(classes):
        raise UserError(
            f"{num_clients} clients with {classes_per_client} classes each cannot hold all "
            f"{len(classes)} classes; use at least {math.ceil(len(classes) / classes_per_client)} clients"
        )
    return share_out(labels, assign_classes(rng, num_clients, classes_per_client, classes), rng)


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
    samples are shared out among all clients, of every group, holding it.
    """
    classes = np.unique(labels)
    group_ids = np.unique(groups)
    if classes_per_client < 1:
        raise UserError(f"classes_per_client must be at least 1, got {classes_per_client}")
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
        group_classes = assign_classes(rng, len(group_ids), classes_per_group, classes)
    client_classes: list[np.ndarray] = [classes[:0]] * len(groups)
    for group, held in zip(group_ids, group_classes):
        members = np.flatnonzero(groups == group)
        per_client = min(len(held), max(classes_per_client, math.ceil(len(held) / len(members))))
        for member, chosen in zip(members, assign_classes(rng, len(members), per_client, held)):
            client_classes[member] = chosen
    return share_out(labels, client_classes, rng)
