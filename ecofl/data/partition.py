"""Splitting a dataset over homes: :func:`partition` and its schemes.

Every scheme is seeded and deterministic, and every sample lands in exactly
one client (the returned index arrays, sorted, are disjoint and cover
``labels``); every client gets at least one sample.

* ``iid``: a shuffled, near-equal split.
* ``shards``: each client holds exactly ``classes_per_client`` classes
  (FedAvg's pathological non-IID split, used throughout Eco-FL §6.1).
* ``dirichlet``: per class, client shares drawn from Dirichlet(``alpha``)
  (Hsu et al. 2019); smaller ``alpha`` is more skewed.
* ``rlg-iid`` / ``rlg-niid``: Eco-FL §6.1's response-latency-group settings;
  see :mod:`ecofl.data.label_skew`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ecofl.data.label_skew import latency_groups, shards
from ecofl.errors import UserError

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "shards", "dirichlet", "rlg-iid", "rlg-niid")


def partition(
    labels: np.ndarray,
    scheme: str,
    num_clients: int,
    *,
    seed: int = 0,
    classes_per_client: int = 2,
    alpha: float = 0.5,
    client_groups: Sequence[int] | None = None,
    num_groups: int = 5,
    classes_per_group: int = 3,
) -> list[np.ndarray]:
    """Split sample indices of ``labels`` over ``num_clients`` clients by ``scheme``.

    ``classes_per_client`` is used by ``shards`` and the RLG schemes,
    ``alpha`` by ``dirichlet``. For the RLG schemes, ``client_groups[i]`` is
    client i's response-latency group; without it client i is in group
    ``i * num_groups // num_clients`` (:func:`default_client_groups`).
    ``classes_per_group`` is the number of classes per group in ``rlg-niid``
    (3 in Eco-FL §6.1). Impossible inputs raise :class:`UserError`.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    if scheme not in PARTITION_SCHEMES:
        raise UserError(f"unknown partition scheme {scheme!r}; valid schemes: {', '.join(PARTITION_SCHEMES)}")
    if not 1 <= num_clients <= len(labels):
        raise UserError(f"num_clients must be between 1 and the {len(labels)} samples, got {num_clients}")
    if classes_per_client < 1:
        raise UserError(f"classes_per_client must be at least 1, got {classes_per_client}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]
    if scheme == "shards":
        return shards(labels, num_clients, classes_per_client, rng)
    if scheme == "dirichlet":
        return dirichlet(labels, num_clients, alpha, rng)
    groups = (default_client_groups(num_clients, num_groups) if client_groups is None
              else _checked_groups(client_groups, num_clients))
    per_group = classes_per_group if scheme == "rlg-niid" else None
    return latency_groups(labels, groups, classes_per_client, per_group, rng)


def default_client_groups(num_clients: int, num_groups: int) -> np.ndarray:
    """Client i's group is ``i * num_groups // num_clients``: contiguous, near-equal groups."""
    if not 1 <= num_groups <= num_clients:
        raise UserError(f"num_groups must be between 1 and the {num_clients} clients, got {num_groups}")
    return np.arange(num_clients) * num_groups // num_clients


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Per class, split its shuffled samples by shares ~ Dirichlet(alpha, ..., alpha).

    A small ``alpha`` can leave a client with no sample at all; each such
    client then takes one sample from the currently largest client, so every
    client can train while the skew is kept.
    """
    if not alpha > 0:
        raise UserError(f"alpha must be positive, got {alpha}")
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in np.unique(labels):
        samples = rng.permutation(np.flatnonzero(labels == label))
        shares = rng.dirichlet(np.full(num_clients, float(alpha)))
        cuts = (np.cumsum(shares)[:-1] * len(samples)).astype(int)
        for client, part in enumerate(np.split(samples, cuts)):
            chunks[client].append(part)
    parts = [np.concatenate(c) for c in chunks]
    for empty in [i for i, part in enumerate(parts) if len(part) == 0]:
        donor = max(range(num_clients), key=lambda i: len(parts[i]))
        taken = rng.integers(len(parts[donor]))
        parts[empty] = parts[donor][taken:taken + 1]
        parts[donor] = np.delete(parts[donor], taken)
    return [np.sort(part) for part in parts]


def _checked_groups(client_groups: Sequence[int], num_clients: int) -> np.ndarray:
    groups = np.asarray(client_groups)
    if groups.shape != (num_clients,) or not np.issubdtype(groups.dtype, np.integer):
        raise UserError(f"client_groups must be {num_clients} integers, one per client")
    return groups
