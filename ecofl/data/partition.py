"""Splitting a dataset over homes: :func:`partition` and its schemes.

Every scheme is seeded and deterministic, and every sample lands in exactly
one client (the returned index arrays, sorted, are disjoint and cover
``labels``); every client gets at least one sample. So there can be no more
clients than samples: for more homes than a dataset has samples (100,000
homes on Fashion-MNIST's 60,000 training images, docs/scale.md), ``iid`` and
``shards`` take ``samples_per_client``, and each client then *draws* that
many distinct samples (of its classes, for ``shards``), with replacement
across clients: a sample may be held by several clients and some by none.

* ``iid``: a shuffled, near-equal split.
* ``shards``: each client holds exactly ``classes_per_client`` classes
  (FedAvg's pathological non-IID split, used throughout Eco-FL §6.1).
* ``dirichlet``: per class, client shares drawn from Dirichlet(``alpha``)
  (Hsu et al. 2019); smaller ``alpha`` is more skewed.
* ``rlg-iid`` / ``rlg-niid``: Eco-FL §6.1's response-latency-group settings;
  see :mod:`ecofl.data.label_skew`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ecofl import names
from ecofl.data.label_skew import assign_classes, latency_groups, shards
from ecofl.errors import UserError

PARTITION_SCHEMES = names.PARTITION_SCHEMES
#: The schemes whose clients can draw ``samples_per_client`` samples with replacement across clients.
DRAWING_SCHEMES: tuple[str, ...] = ("iid", "shards")


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
    samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """Split sample indices of ``labels`` over ``num_clients`` clients by ``scheme``.

    ``classes_per_client`` is used by ``shards`` and the RLG schemes,
    ``alpha`` by ``dirichlet``. For the RLG schemes, ``client_groups[i]`` is
    client i's response-latency group; without it client i is in group
    ``i * num_groups // num_clients`` (:func:`default_client_groups`).
    ``classes_per_group`` is the number of classes per group in ``rlg-niid``
    (3 in Eco-FL §6.1). ``samples_per_client`` (``iid`` and ``shards``
    only): each client draws that many samples instead, with replacement
    across clients (:func:`drawn`). Impossible inputs raise :class:`UserError`.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise UserError(f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}")
    check_partition(len(labels), num_clients, {"scheme": scheme, "samples_per_client": samples_per_client})
    if classes_per_client < 1:
        raise UserError(f"classes_per_client must be at least 1, got {classes_per_client}")
    rng = np.random.default_rng(seed)
    if samples_per_client is not None:
        return drawn(labels, num_clients, samples_per_client, classes_per_client if scheme == "shards" else None, rng)
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


def check_partition(num_samples: int, num_clients: int, options: Mapping) -> None:
    """Raise :class:`UserError` unless ``options`` (a scheme and its options) can give each of
    ``num_clients`` clients data from ``num_samples`` samples (checked before any work is done)."""
    scheme = options.get("scheme")
    if scheme not in PARTITION_SCHEMES:
        raise UserError(f"unknown partition scheme {scheme!r}; valid schemes: {', '.join(PARTITION_SCHEMES)}")
    if num_clients < 1:
        raise UserError(f"the number of clients must be at least 1, got {num_clients}")
    drawing = options.get("samples_per_client")
    if drawing is None:
        if num_clients > num_samples:
            raise UserError(
                f"{num_clients} homes cannot each get data from {num_samples} training samples: partition "
                f"{scheme!r} gives every sample to exactly one home; let each home draw N samples with replacement "
                f"across homes with partition.samples_per_client=N (schemes {', '.join(DRAWING_SCHEMES)})"
            )
        return
    if scheme not in DRAWING_SCHEMES:
        raise UserError(f"partition.samples_per_client works with the schemes {', '.join(DRAWING_SCHEMES)}, "
                        f"not {scheme!r}")
    if isinstance(drawing, bool) or not isinstance(drawing, int) or not 1 <= drawing <= num_samples:
        raise UserError(f"partition.samples_per_client must be an integer from 1 to the {num_samples} samples, "
                        f"got {drawing!r}")


def drawn(
    labels: np.ndarray,
    num_clients: int,
    samples_per_client: int,
    classes_per_client: int | None,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """Each client draws ``samples_per_client`` distinct samples; clients draw independently (with replacement
    across clients).

    ``classes_per_client=None`` (``iid``): from the whole dataset. Otherwise
    (``shards``): each client first gets ``classes_per_client`` classes, as
    many clients per class as the classes' sizes suggest
    (:func:`~ecofl.data.label_skew.assign_classes`, no cap), and draws
    near-equal numbers of samples from each of them (at most the class's size).
    """
    classes, sizes = np.unique(labels, return_counts=True)
    if classes_per_client is None:
        pools = [np.arange(len(labels))]
        holders = [np.arange(num_clients)]
        wanted = [np.full(num_clients, samples_per_client)]
    else:
        if classes_per_client > len(classes) or num_clients * classes_per_client < len(classes):
            raise UserError(f"cannot give {num_clients} clients {classes_per_client} of {len(classes)} classes each "
                            "so that every class is used")
        chosen = np.stack(assign_classes(rng, num_clients, classes_per_client, classes, sizes))
        share = np.full(chosen.shape, samples_per_client // classes_per_client)
        share[:, : samples_per_client % classes_per_client] += 1  # the first classes take the remainder
        pools, holders, wanted = [], [], []
        for position, label in enumerate(classes):
            clients, slot = np.nonzero(chosen == label)
            pools.append(np.flatnonzero(labels == label))
            holders.append(clients)
            wanted.append(np.minimum(share[clients, slot], sizes[position]))
    chunks: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for pool, clients, counts in zip(pools, holders, wanted):
        for count in np.unique(counts):
            group = clients[counts == count]
            for client, picks in zip(group, _distinct_draws(rng, len(pool), int(count), len(group))):
                chunks[client].append(pool[picks])
    return [np.sort(np.concatenate(parts)) for parts in chunks]


def _distinct_draws(rng: np.random.Generator, size: int, count: int, rows: int) -> np.ndarray:
    """``rows`` rows of ``count`` distinct integers below ``size`` each, uniformly (rows with a repeat are drawn
    again; when ``count`` is a large part of ``size`` each row is a permutation's prefix)."""
    if count * 4 > size:
        return np.stack([rng.permutation(size)[:count] for _ in range(rows)]) if rows else np.zeros((0, count), int)
    draws = rng.integers(size, size=(rows, count))
    while True:
        ordered = np.sort(draws, axis=1)
        repeated = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
        if not repeated.size:
            return draws
        draws[repeated] = rng.integers(size, size=(len(repeated), count))


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
