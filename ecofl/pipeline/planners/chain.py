"""Pipelines of single-device stages: the objective Eco-FL and PipeEdge minimise.

A chain is a sequence of devices, device k running layers ``cuts[k] ..
cuts[k+1]-1``. Its per-micro-batch bottleneck is the largest of every stage's
compute time and every cut's transfer time, Eco-FL eq. 1 / PipeEdge eq. 3:

    max_k max( T(cuts[k] -> cuts[k+1]-1, d_k),  (a + b) * beta / B(d_{k-1}, d_k) )

(communication overlaps computation, so a link is a pipeline resource of its
own). Stage k must hold its P_k = 2(S-k)-1 forward tasks in memory (the strict
Eco-FL §4.3 condition), or at least one (the relaxed fallback).

Identical devices (same spec, and the pool's links are the default ones
derived from the devices' own) are interchangeable: :func:`categories`
groups them, so order searches enumerate multiset permutations (Eco-FL) and
device subsets become count vectors (PipeEdge Table II).
"""

from __future__ import annotations

import numpy as np

from ecofl.devices import HomePool
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners.memory import fits, stage_in_flight, target_in_flight
from ecofl.pipeline.planners.tables import StageTables


def categories(pool: HomePool) -> list[list[int]]:
    """Pool device indices grouped into classes of interchangeable devices (first-seen order)."""
    links = np.array([d.bandwidth_bps for d in pool.devices])
    derived = np.minimum.outer(links, links)
    np.fill_diagonal(derived, np.inf)
    if not np.array_equal(derived, pool.bandwidth_bps):
        return [[d] for d in range(len(pool))]
    classes: dict[object, list[int]] = {}
    for index, spec in enumerate(pool.devices):
        classes.setdefault(spec, []).append(index)
    return list(classes.values())


def category_bandwidth(pool: HomePool, classes: list[list[int]]) -> np.ndarray:
    """``[u, v]``: bandwidth from a device of class u to another device of class v (inf if none)."""
    n = len(classes)
    out = np.full((n, n), np.inf)
    for u, cu in enumerate(classes):
        for v, cv in enumerate(classes):
            others = [d for d in cv if d != cu[0]]
            if others:
                out[u, v] = pool.bandwidth_bps[cu[0], others[0]]
    return out


def chain_bottleneck(tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int]) -> float:
    """Eco-FL eq. 1 / PipeEdge eq. 3 of a chain (``cuts`` = [0, ..., L]), ignoring memory."""
    worst = 0.0
    for k, d in enumerate(devices):
        i, j = cuts[k], cuts[k + 1]
        worst = max(worst, (tables.compute[j] - tables.compute[i]) / pool.devices[d].speed)
        if k > 0:
            worst = max(worst, tables.micro_batch * tables.cut_bytes[i] / pool.bandwidth_bps[devices[k - 1], d])
    return worst


def chain_fits(tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int], strict: bool) -> bool:
    """Every stage holds P_k forward tasks (strict) or one (relaxed) within its device's memory."""
    for k, d in enumerate(devices):
        i, j = cuts[k], cuts[k + 1]
        tasks = target_in_flight(len(devices), k) if strict else 1
        need = tables.static[j] - tables.static[i] + tasks * tables.micro_batch * (tables.stash[j] - tables.stash[i])
        if need > pool.devices[d].memory_bytes:
            return False
    return True


def chain_plan(
    planner: str, tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int], batch_size: int
) -> Plan:
    """The Plan of a chain: one device per stage, K_s = min(P_s, Q_s, M), 1F1B-Sync."""
    beta = tables.micro_batch
    m = batch_size // beta
    stages = []
    for k, d in enumerate(devices):
        layers = (cuts[k], cuts[k + 1] - 1)
        in_flight = stage_in_flight(
            tables, layers, (beta,), [pool.devices[d].memory_bytes], target_in_flight(len(devices), k), m
        )
        stages.append(StagePlan(layers=layers, devices=(d,), shares=(beta,), in_flight=in_flight))
    return Plan(planner=planner, stages=tuple(stages), micro_batch=beta, num_micro_batches=m)


class StageTimes:
    """``[i, j]`` seconds of layers i..j-1 on a device of each class, inf where it does not fit.

    ``get(c, tasks)`` is cached: the stage must hold ``tasks`` forward tasks of
    a micro-batch in the memory of class c's devices (Asteroid eq. 3).
    """

    def __init__(self, tables: StageTables, pool: HomePool, classes: list[list[int]]):
        self.tables, self.pool, self.classes = tables, pool, classes
        self._compute = tables.compute_span
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def get(self, c: int, tasks: int) -> np.ndarray:
        key = (c, tasks)
        if key not in self._cache:
            spec = self.pool.devices[self.classes[c][0]]
            ok = fits(self.tables, tasks, self.tables.micro_batch, spec.memory_bytes)
            self._cache[key] = np.where(ok, self._compute / spec.speed, np.inf)
        return self._cache[key]
