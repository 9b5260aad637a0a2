"""Device-level dynamics of a home, as names of pool states (Eco-FL §4.4's setting in the FL simulation).

A smart home is not one fixed pool: a phone leaves with its owner and comes
back, a TV box gets busy streaming. A *pool state* is the home's pool with
at most one device changed, named by a plain string that the server, every
client and the planner agree on:

- ``"<pool>"``: every device present, at its own speed;
- ``"<pool>~leave<d>"``: device d is gone (never the portal, device 0,
  which holds the home's data);
- ``"<pool>~load<d>x<F>"``: device d is busy with other work and computes
  F times slower.

The home's latency in a state is its pool *re-planned* with the pipeline
planner (``ecofl.fl.pipeline_rounds``), so a device that leaves or slows
down changes the home's round time the way the home pipeline would adapt
to it, instead of one home-wide multiplier.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from ecofl.devices import HomePool
from ecofl.pools import load_pool
from ecofl.errors import UserError

_STATE = re.compile(r"^(?P<pool>[^~]+)(~leave(?P<leave>\d+)|~load(?P<load>\d+)x(?P<factor>[0-9.]+))?$")


def device_states(pool_name: str, load_factor: float = 4.0) -> list[str]:
    """The pool itself, then each non-portal device gone, then each device ``load_factor`` times slower."""
    if not load_factor > 1:
        raise UserError(f"a device's load factor must be above 1, got {load_factor}")
    n = len(load_pool(pool_name))
    return ([pool_name] + [f"{pool_name}~leave{d}" for d in range(1, n)]
            + [f"{pool_name}~load{d}x{load_factor:g}" for d in range(n)])


def resolve_pool(state: str, bandwidth_mbps: float | None = None) -> HomePool:
    """The :class:`HomePool` a pool state names (a plain pool name gives :func:`ecofl.pools.load_pool`'s)."""
    match = _STATE.match(state)
    if match is None:
        raise UserError(f"bad pool state {state!r}: expected POOL, POOL~leave<d> or POOL~load<d>x<F>")
    pool = load_pool(match["pool"], bandwidth_mbps)
    n = len(pool)
    if match["leave"] is not None:
        gone = int(match["leave"])
        if not 1 <= gone < n:
            raise UserError(f"pool state {state!r}: device {gone} cannot leave a pool of {n} (the portal stays)")
        kept = [d for d in range(n) if d != gone]
        bandwidth = np.array(pool.bandwidth_bps, dtype=float)
        np.fill_diagonal(bandwidth, 1.0)
        return HomePool(state, tuple(pool.devices[d] for d in kept), bandwidth[np.ix_(kept, kept)])
    if match["load"] is not None:
        busy, factor = int(match["load"]), float(match["factor"])
        if not 0 <= busy < n or not factor > 0:
            raise UserError(f"pool state {state!r}: no device {busy} in a pool of {n}, or a bad factor")
        devices = tuple(replace(d, speed=d.speed / factor) if i == busy else d for i, d in enumerate(pool.devices))
        return HomePool(state, devices, pool.bandwidth_bps)
    return pool
