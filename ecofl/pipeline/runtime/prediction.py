"""The cost model's sync-round for a pipeline as it will really run, in each emulation mode.

Sleeping devices follow the cost model by construction (Eco-FL §4.2's
sync-round, eq. 1-2, simulated event by event: :func:`ecofl.pipeline.cost.simulate`).
Where devices compute for real, confined to their quotas or at host speed,
every forward and backward also costs the runtime's own work, per operation
and per byte sent or received (:mod:`.host_overhead`, measured once on this
host), at the device's speed; at host speed the devices share this machine's
cores. One function for every figure that sets a prediction beside a
measurement: the CLI, the benchmarks and a simulation's pipeline homes.
"""

from __future__ import annotations

import dataclasses

from ecofl.devices import HomePool, host_cores, host_pool
from ecofl.pipeline.cost import SyncRoundCost, simulate
from ecofl.pipeline.modes import mode_of
from ecofl.pipeline.plan import Plan
from ecofl.pipeline.profile import ModelProfile
from ecofl.pipeline.runtime.emulation import Emulation
from ecofl.pipeline.runtime.host_overhead import runtime_overheads


def predict_sync_round(plan: Plan, profile: ModelProfile, pool: HomePool, emulation: Emulation | bool | str,
                       rounds: int = 1, cache_dir: str | None = None) -> SyncRoundCost:
    """The cost model's sync-round of ``plan``: on the pool (confined: at the speeds its devices measured), or
    on its devices as processes of this machine (``emulation`` none). An asynchronous 1F1B plan runs a call's
    ``rounds`` x M micro-batches as one pass: that pass is predicted."""
    per_pass = mode_of(plan).rounds_per_pass(rounds)
    plan = dataclasses.replace(plan, num_micro_batches=plan.num_micro_batches * per_pass)
    emulation = Emulation.parse(emulation)
    overheads = runtime_overheads(emulation, cache_dir)
    if emulation != Emulation.NONE:  # each device its own cores; confined, the runtime's work at its speed too
        return simulate(plan, profile, pool, **overheads)
    return simulate(plan, profile, host_pool(pool), cores=host_cores(), **overheads)
