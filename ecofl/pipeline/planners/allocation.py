"""Asteroid Algorithm 1: splitting a micro-batch over the devices of a data-parallel stage.

Eq. 7 asks for shares y_d (summing to the micro-batch B, each within its
device's memory, eq. 3) minimising the slowest device's FP + BP time.
Algorithm 1 answers it in two phases:

1. **Memory-aware balancing** (lines 1-12): give each device
   min(v_d / sum(v) * beta, bs_d) samples, v_d the inverse of its time for a
   whole micro-batch (eq. 9) and bs_d what its remaining memory still holds;
   recurse with the unallocated samples over the devices with memory left.
   Fails (infinite stage time) if memory runs out first. Shares are integers:
   each round rounds the proportional quotas by largest remainder, so a round
   in which no cap binds allocates everything and at most |G| rounds run.
2. **Straggler offloading** (lines 13-20): move one block of samples from
   the slowest device to the fastest one with memory for it, while that makes
   the slowest device faster (time is not linear in batch size, Asteroid
   Fig. 6, so proportional shares are not optimal). The move that fails to
   help is undone, so the result is never slower than phase 1's.

Everything runs on R rows at once (one row per layer range, say): the DP of
:mod:`ecofl.pipeline.planners.hpp` allocates every range of a device group in
one call, and a single stage is a call with R = 1.
"""

from __future__ import annotations

import numpy as np


class RangeTimes:
    """Seconds of a layer range on each device of a group, for any shares.

    ``forward[y, l]`` / ``backward[y, l]`` are host-time prefix sums at batch y
    (:func:`ecofl.pipeline.planners.tables.batch_prefix`); rows are the ranges
    ``first[r] .. end[r]-1``.
    """

    def __init__(self, forward: np.ndarray, backward: np.ndarray, first: np.ndarray, end: np.ndarray,
                 speeds: np.ndarray):
        self.forward, self.backward = forward, backward
        self.first, self.end = np.asarray(first)[:, None], np.asarray(end)[:, None]
        self.speeds = np.asarray(speeds, dtype=float)[None, :]

    def split(self, shares: np.ndarray, rows: np.ndarray | slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward seconds ``[r, d]`` of every device with ``shares[r, d]`` samples."""
        first, end = self.first[rows], self.end[rows]
        f = (self.forward[shares, end] - self.forward[shares, first]) / self.speeds
        b = (self.backward[shares, end] - self.backward[shares, first]) / self.speeds
        return f, b

    def total(self, shares: np.ndarray, rows: np.ndarray | slice = slice(None)) -> np.ndarray:
        f, b = self.split(shares, rows)
        return f + b


def proportional(weights: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Integer split of ``amount[r]`` in proportion to ``weights[r, :]`` (largest remainder)."""
    total = weights.sum(axis=1, keepdims=True)
    quota = np.divide(weights * amount[:, None], total, out=np.zeros_like(weights, dtype=float), where=total > 0)
    base = np.floor(quota + 1e-9)
    left = amount - base.sum(axis=1)
    rank = np.argsort(np.argsort(-(quota - base), axis=1, kind="stable"), axis=1, kind="stable")
    return (base + (rank < left[:, None])).astype(int)


def balance(times: RangeTimes, caps: np.ndarray, micro_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Phase 1 (MemoryAwareBalancing): shares ``[R, g]`` and which rows succeeded."""
    rows, g = caps.shape
    full = np.full((rows, g), micro_batch)
    speed = 1.0 / np.maximum(times.total(full), 1e-300)  # v_d, eq. 9
    shares = np.zeros((rows, g), dtype=int)
    left = np.full(rows, micro_batch)
    room = caps.astype(int).copy()
    for _ in range(g):
        active = (room > 0) & (left > 0)[:, None]
        if not active.any():
            break
        add = np.minimum(proportional(np.where(active, speed, 0.0), left), room)
        shares += add
        room -= add
        left -= add.sum(axis=1)
    return shares, left == 0


def offload(times: RangeTimes, caps: np.ndarray, shares: np.ndarray, ok: np.ndarray, block: int) -> np.ndarray:
    """Phase 2 (StragglerWorkloadOffloading) on the rows where ``ok``; returns new shares."""
    shares = shares.copy()
    rows = np.flatnonzero(ok)
    current = times.total(shares[rows], rows)
    while rows.size:
        k = np.arange(rows.size)
        y = shares[rows]
        slow = current.argmax(axis=1)
        old = current[k, slow]
        moved = np.minimum(block, y[k, slow])
        room = caps[rows] - y >= moved[:, None]
        room[k, slow] = False
        fast = np.where(room, current, np.inf).argmin(axis=1)
        can = room[k, fast] & (moved > 0)
        trial = y.copy()
        trial[k, slow] -= moved
        trial[k, fast] += moved
        new = times.total(trial, rows)
        better = can & (new.max(axis=1) < old)
        shares[rows[better]] = trial[better]
        rows, current = rows[better], new[better]
    return shares


def allocate(times: RangeTimes, caps: np.ndarray, micro_batch: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 1: shares ``[R, g]`` within ``caps`` (samples each device's memory holds) and feasibility."""
    caps = np.minimum(np.maximum(caps, 0), micro_batch).astype(int)
    shares, ok = balance(times, caps, micro_batch)
    return offload(times, caps, shares, ok, max(1, block)), ok
