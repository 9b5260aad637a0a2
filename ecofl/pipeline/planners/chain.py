"""Pipelines of single-device stages: the objective Eco-FL and PipeEdge minimise.

A chain is a sequence of devices, device k running layers ``cuts[k] ..
cuts[k+1]-1``. Its per-micro-batch bottleneck is the largest of every stage's
compute time and every cut's transfer time, Eco-FL eq. 1 / PipeEdge eq. 3:

    max_k max( T(cuts[k] -> cuts[k+1]-1, d_k),  c * beta / B(d_{k-1}, d_k) )

(communication overlaps computation, so a link is a pipeline resource of its
own). For training T is forward + backward and c = a + b (activation forward,
gradient backward); for inference (PipeEdge's own objective) T is the forward
and c = a. Stage k must hold its target tasks in memory (the strict
condition: P_k = 2(S-k)-1 forward tasks for training, Eco-FL §4.3; three
micro-batches for inference), or at least one (the relaxed fallback). The
objective lives in the :class:`StageTables`, so the searches here are the same
for both.

For inference the portal's transfers join the max: the inputs it sends to
the first device and the predictions it receives from the last, each zero
when that device is the portal (:func:`portal_seconds`); so a chain's
bottleneck is exactly the period the stream simulation settles to
(:mod:`ecofl.pipeline.stream`).

Identical devices (same spec, and the pool's links are the default ones
derived from the devices' own) are interchangeable: :func:`categories`
groups them, so order searches enumerate multiset permutations (Eco-FL) and
device subsets become count vectors (PipeEdge Table II). For inference the
portal is a class of its own (whether the first or last device is the portal
changes the cost).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.planners.memory import fits, stage_in_flight
from ecofl.pipeline.planners.tables import StageTables, stage_tables
from ecofl.pipeline.profile import ModelProfile


def categories(pool: HomePool, portal_apart: bool = False) -> list[list[int]]:
    """Pool device indices grouped into classes of interchangeable devices (first-seen order).

    With ``portal_apart`` the portal (device 0) is a class of its own.
    """
    links = np.array([d.bandwidth_bps for d in pool.devices])
    derived = np.minimum.outer(links, links)
    np.fill_diagonal(derived, np.inf)
    if not np.array_equal(derived, pool.bandwidth_bps):
        return [[d] for d in range(len(pool))]
    classes: dict[object, list[int]] = {}
    for index, spec in enumerate(pool.devices):
        classes.setdefault(("portal",) if portal_apart and index == 0 else spec, []).append(index)
    return list(classes.values())


def portal_seconds(tables: StageTables, pool: HomePool, devices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per device: seconds of a micro-batch's input from the portal to it, and of its output back.

    Zero for the portal itself, and for training tables (their
    ``input_bytes`` and ``output_bytes`` are zero: eq. 1 leaves the portal's
    transfers to the cost model).
    """
    to_device, to_portal = np.zeros(len(devices)), np.zeros(len(devices))
    for k, d in enumerate(devices):
        if d != 0:
            to_device[k] = tables.micro_batch * tables.input_bytes / pool.bandwidth_bps[0, d]
            to_portal[k] = tables.micro_batch * tables.output_bytes / pool.bandwidth_bps[d, 0]
    return to_device, to_portal


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
    to_device, to_portal = portal_seconds(tables, pool, [devices[0], devices[-1]])
    worst = max(0.0, float(to_device[0]), float(to_portal[1]))
    for k, d in enumerate(devices):
        i, j = cuts[k], cuts[k + 1]
        worst = max(worst, (tables.compute[j] - tables.compute[i]) / pool.devices[d].speed)
        if k > 0:
            worst = max(worst, tables.micro_batch * tables.cut_bytes[i] / pool.bandwidth_bps[devices[k - 1], d])
    return worst


def chain_fits(tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int], strict: bool) -> bool:
    """Every stage holds its target tasks (strict) or one (relaxed) within its device's memory."""
    for k, d in enumerate(devices):
        i, j = cuts[k], cuts[k + 1]
        tasks = tables.in_flight_target(len(devices), k) if strict else 1
        if tables.stage_memory(i, j, tasks, tables.micro_batch) > pool.devices[d].memory_bytes:
            return False
    return True


def chain_plan(
    planner: str, tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int], batch_size: int
) -> Plan:
    """The Plan of a chain: one device per stage, K_s = min(P_s, Q_s, M), 1F1B-Sync (or a stream)."""
    beta = tables.micro_batch
    m = batch_size // beta
    stages = []
    for k, d in enumerate(devices):
        layers = (cuts[k], cuts[k + 1] - 1)
        in_flight = stage_in_flight(
            tables, layers, (beta,), [pool.devices[d].memory_bytes], tables.in_flight_target(len(devices), k), m
        )
        stages.append(StagePlan(layers=layers, devices=(d,), shares=(beta,), in_flight=in_flight))
    return Plan(planner=planner, stages=tuple(stages), micro_batch=beta, num_micro_batches=m,
                schedule=tables.schedule)


class StageTimes:
    """``[i, j]`` seconds of layers i..j-1 on a device of each class, inf where it does not fit.

    ``get(c, tasks)`` is cached: the stage must hold ``tasks`` tasks of a
    micro-batch in the memory of class c's devices (Asteroid eq. 3, or the
    inference memory of the tables' objective).
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


MICRO_BATCH_RULES = ("largest", "fastest")


def round_estimate(tables: StageTables, pool: HomePool, devices: list[int], cuts: list[int],
                   num_micro_batches: int) -> float:
    """Eco-FL §4.3's sync-round estimate without DDB: M x bottleneck + SSB (eq. 2).

    For inference tables the same sum is the time to stream M micro-batches:
    M bottleneck periods plus the pipeline's fill (every stage but the last,
    forward and transfer).
    """
    ssb = 0.0
    for k in range(len(devices) - 1):
        i, j = cuts[k], cuts[k + 1]
        ssb += (tables.compute[j] - tables.compute[i]) / pool.devices[devices[k]].speed
        ssb += tables.micro_batch * tables.cut_bytes[j] / pool.bandwidth_bps[devices[k], devices[k + 1]]
    return num_micro_batches * chain_bottleneck(tables, pool, devices, cuts) + ssb


Search = Callable[[StageTables, HomePool, bool], tuple[float, list[int], list[int]]]


def choose_micro_batch(
    profile: ModelProfile, pool: HomePool, batch_size: int, sizes: list[int], search: Search, rule: str,
    objective: str = "training",
) -> tuple[StageTables, list[int], list[int]] | None:
    """Eco-FL §4.3 micro-batch search over ``sizes`` (largest first) with a chain ``search``.

    Rule ``largest`` (the paper's): the first size at which some chain holds
    its target tasks everywhere (K_s = P_s). Rule ``fastest``: of all such
    sizes, the one with the smallest :func:`round_estimate` (memory can force a
    large micro-batch into a lopsided partition). Without any such size, the
    same rule over sizes at which every stage holds one task.
    """
    if rule not in MICRO_BATCH_RULES:
        raise UserError(f"unknown micro-batch rule {rule!r}; valid: {', '.join(MICRO_BATCH_RULES)}")
    for strict in (True, False):
        found = []
        for beta in sizes:
            tables = stage_tables(profile, beta, objective)
            value, devices, cuts = search(tables, pool, strict)
            if not np.isfinite(value):
                continue
            if rule == "largest":
                return tables, devices, cuts
            found.append((round_estimate(tables, pool, devices, cuts, batch_size // beta), beta, tables, devices, cuts))
        if found:
            return min(found, key=lambda f: (f[0], -f[1]))[2:]
    return None
