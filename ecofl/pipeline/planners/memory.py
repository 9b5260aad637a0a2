"""Memory rules every planner shares: tasks in flight, micro-batch sizes, infeasibility.

- **Target in flight** (:meth:`StageTables.in_flight_target`): for training
  P_s = 2(S - s) - 1 (Eco-FL eq. 3 with non-negligible links; Asteroid's K_p
  of §3.2), what stage s of S needs to avoid dependency bubbles; for
  inference the 3 micro-batches that overlap receiving, computing and sending
  (:data:`ecofl.pipeline.plan.STREAM_IN_FLIGHT`).
- **Memory limit** Q_s: the most tasks that fit beside the stage's static
  bytes (Asteroid eq. 3; for inference the weights and one forward's working
  set); the plan keeps K_s = min(P_s, Q_s, M) (Eco-FL §4.3).
- **Micro-batch sizes** are divisors of the mini-batch, so that
  ``micro_batch * num_micro_batches == batch_size`` exactly; the pipeline
  planners try them from large to small (Eco-FL §4.3) and only those that give
  at least ``2N - 1`` micro-batches on an N-device pool, so that stage 0 can
  really hold its P_0 forward tasks (all divisors if the mini-batch is too
  small for that). Where the runtime's cost model chooses the size
  (:func:`ecofl.pipeline.planners.plans_by_micro_batch`), every size that
  fills a two-stage pipeline (M >= 3) is weighed: a hybrid plan has fewer
  stages than devices.
- **Infeasible**: when no plan fits, :func:`raise_infeasible` finds the
  partition of the layers over the pool (largest memory first, a device may
  take no layers) whose worst memory overflow is smallest, at one sample and
  one task, and names that device and the bytes it misses.
"""

from __future__ import annotations

import numpy as np

from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.planners.tables import StageTables, stage_tables
from ecofl.pipeline.profile import ModelProfile


def max_in_flight(static: float, per_task: float, share: int, budget: float) -> int:
    """Q: tasks of ``share`` samples, ``per_task`` bytes a sample each, that fit in ``budget`` beside ``static``."""
    if static > budget:
        return 0
    if share == 0 or per_task <= 0:
        return 1 << 30
    return int((budget - static) // (per_task * share))


def stage_in_flight(
    tables: StageTables, layers: tuple[int, int], shares: tuple[int, ...], budgets: list[float],
    target: int, num_micro_batches: int,
) -> int:
    """K_s = min(P_s, Q_s, M) for a stage of inclusive ``layers`` (Q over its devices with samples).

    A stream (inference) is not M micro-batches long, so there K_s = min(P_s, Q_s).
    """
    first, end = layers[0], layers[1] + 1
    static = tables.static[end] - tables.static[first]
    per_task, transient = tables.resident_span[first, end], tables.transient_span[first, end]
    q = min(max_in_flight(static + y * transient, per_task, y, u) for y, u in zip(shares, budgets) if y > 0)
    if tables.objective == "inference":
        return max(1, min(target, q))
    return max(1, min(target, q, num_micro_batches))


def fits(tables: StageTables, in_flight: int, share: int, budget: float) -> np.ndarray:
    """``[i, j]``: layers i..j-1 with ``in_flight`` tasks of ``share`` samples fit ``budget`` (eq. 3)."""
    return (tables.memory_span(in_flight, share) <= budget) & tables.valid()


def divisors(n: int) -> list[int]:
    """Divisors of n, largest first."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]), reverse=True)


def micro_batch_candidates(batch_size: int, num_devices: int) -> list[int]:
    """Micro-batch sizes to try, largest first: divisors giving M >= 2N - 1 micro-batches."""
    if batch_size < 1:
        raise UserError(f"batch size must be positive, got {batch_size}")
    sizes = divisors(batch_size)
    filling = [d for d in sizes if batch_size // d >= 2 * num_devices - 1]
    return filling or sizes


def raise_infeasible(
    profile: ModelProfile, pool: HomePool, planner: str, every_device: bool = False, micro_batch: int = 1,
    objective: str = "training",
) -> None:
    """Raise the UserError for a model ``planner`` cannot fit (see the module docstring).

    With ``every_device`` each device must take at least one layer (planners
    that pipeline over the whole pool). ``micro_batch`` is the smallest
    micro-batch the planner was allowed (1 unless the user fixed it).
    """
    order = sorted(range(len(pool)), key=lambda d: -pool.devices[d].memory_bytes)
    tables = stage_tables(profile, micro_batch, objective)
    need = tables.memory_span(1, micro_batch)  # [i, j]: layers i..j-1, one task
    n = profile.num_layers + 1
    empty = ~tables.valid()
    best = np.full(n, np.inf)
    best[0] = -np.inf
    choices = []
    for d in order:
        over = np.where(empty, np.inf if every_device else -np.inf, need - pool.devices[d].memory_bytes)
        over[np.tril_indices(n, k=-1)] = np.inf
        cand = np.maximum(best[:, None], over)
        choices.append(np.argmin(cand, axis=0))
        best = cand.min(axis=0)
    # walk back to the device whose overflow is the worst in the closest fit
    j, worst = n - 1, (-np.inf, None, 0.0)
    walk = zip(reversed(order), reversed(choices)) if np.isfinite(best[-1]) else ()
    for d, choice in walk:
        i = int(choice[j])
        if i < j:
            missing = need[i, j] - pool.devices[d].memory_bytes
            if missing > worst[0]:
                worst = (missing, d, need[i, j])
        j = i
    missing, device, needed = worst
    if device is None or missing <= 0:
        raise UserError(
            f"planner {planner!r} finds no plan of model {profile.model!r} ({profile.num_layers} layers) "
            f"on pool {pool.name!r} ({len(pool)} devices)"
            + ("; it needs every device in the pipeline: try planner 'pipeedge' or 'hpp'" if every_device else "")
        )
    spec = pool.devices[device]
    raise UserError(
        f"model {profile.model!r} fits pool {pool.name!r} in no way ({planner}): even with micro-batches "
        f"of {micro_batch} sample{'s' if micro_batch > 1 else ''}, "
        f"the closest fit leaves device {device} ({spec.name}, {spec.memory_bytes} bytes) "
        f"{int(np.ceil(missing))} bytes short (needs {int(needed)})"
    )
