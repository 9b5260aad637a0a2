"""A home's response latency L_n as a function of virtual time (Eco-FL §6.1).

Every model is a pure function of its configuration, the home and the
virtual time: the server and every client build the same model from the
same config (:func:`make_latency_model`) and compute the same latency
without talking to each other, and a resumed run sees the same latencies.

* :class:`PaperLatency`: the paper's simulation, a base delay drawn from a
  normal distribution times a *collaborative degree* from {0.2, ..., 1.0}.
* :class:`PipelineLatency`: the home's device pool, planned by the pipeline
  planner: sync-round time x local steps + model download and upload.
* :class:`FixedLatency`: given latencies, constant in time (tests, replay).

The *dynamic setting* (§6.1): time is cut into periods of ``period_s``; at
each period boundary every home changes state (its collaborative degree, or
its pool and load) with probability ``change_prob``. The draw for (home,
period) comes from a generator seeded by (seed, home, period), so it does not
depend on which homes or times were asked about before.
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from ecofl.device_dynamics import device_states
from ecofl.devices import MBPS
from ecofl.errors import UserError

PAPER_DEGREES = (0.2, 0.4, 0.6, 0.8, 1.0)
#: A drawn base delay is clipped below at this fraction of the mean (a normal draw can be <= 0).
MIN_BASE_FRACTION = 0.05


class LatencyModel(Protocol):
    def latency(self, home: int, t: float) -> float:
        """Response latency (seconds) of ``home`` for a round dispatched at virtual time ``t``."""
        ...


class StateSchedule:
    """Each home's state index per period: a seeded Markov chain that changes with ``change_prob``.

    At each period boundary a home keeps its state with probability
    ``1 - change_prob`` and otherwise moves to one of its other states,
    uniformly. States are computed lazily and cached per home.
    """

    def __init__(
        self, initial: Sequence[int], num_states: Sequence[int], change_prob: float, period_s: float, seed: int
    ):
        if not 0.0 <= change_prob <= 1.0:
            raise UserError(f"change_prob must lie in [0, 1], got {change_prob}")
        if not period_s > 0:
            raise UserError(f"period_s must be positive, got {period_s}")
        self.num_states = np.asarray(num_states, dtype=int)
        self.change_prob = change_prob
        self.period_s = period_s
        self.seed = seed
        self._history: list[list[int]] = [[int(i)] for i in initial]

    def index(self, home: int, t: float) -> int:
        if not 0 <= home < len(self._history):
            raise UserError(f"home {home} out of range 0..{len(self._history) - 1}")
        if t < 0:
            raise ValueError(f"virtual time cannot be negative, got {t}")
        period = int(t // self.period_s)
        history = self._history[home]
        while len(history) <= period:
            current = history[-1]
            rng = np.random.default_rng([self.seed, home, len(history)])
            if self.num_states[home] > 1 and rng.random() < self.change_prob:
                other = int(rng.integers(self.num_states[home] - 1))
                current = other + (other >= current)
            history.append(current)
        return history[period]


class PaperLatency:
    """Eco-FL §6.1: base delay ~ Normal(mean_s, std_s) (clipped positive) x collaborative degree.

    A home's initial degree is drawn uniformly from ``degrees``; in the
    dynamic setting it changes with ``change_prob`` per period (``period_s``,
    by default ``mean_s``: about one round).
    """

    def __init__(
        self,
        num_homes: int,
        mean_s: float = 10.0,
        std_s: float = 3.0,
        degrees: Sequence[float] = PAPER_DEGREES,
        seed: int = 0,
        change_prob: float = 0.0,
        period_s: float | None = None,
    ):
        if num_homes < 1 or not mean_s > 0 or std_s < 0 or not degrees or min(degrees) <= 0:
            raise UserError(
                f"invalid paper latency model: num_homes={num_homes}, mean_s={mean_s}, std_s={std_s}, degrees={degrees}"
            )
        rng = np.random.default_rng([seed, num_homes])
        self.base_s = np.maximum(rng.normal(mean_s, std_s, num_homes), MIN_BASE_FRACTION * mean_s)
        self.degrees = tuple(float(d) for d in degrees)
        initial = rng.integers(len(self.degrees), size=num_homes)
        self.schedule = StateSchedule(
            initial, [len(self.degrees)] * num_homes, change_prob, period_s or mean_s, seed
        )

    def degree(self, home: int, t: float) -> float:
        return self.degrees[self.schedule.index(home, t)]

    def latency(self, home: int, t: float) -> float:
        return float(self.base_s[home] * self.degree(home, t))


class PipelineLatency:
    """A home's round time from its device pool's pipeline plan.

    ``latency = sync_round_s(pool) * load * local_steps + 2 * model_bytes / uplink_bps``:
    the planner's predicted time of one sync-round (one mini-batch through the
    pipeline, ``ecofl.pipeline``) for every optimizer step of the round, plus
    downloading and uploading the model over the home's uplink.

    ``sync_round_s`` is injected by the caller (it plans the pool with the
    pipeline planner and simulates the plan: ``ecofl.fl`` does not import
    ``ecofl.pipeline``); it is called once per pool name and cached.
    ``pools[h]`` is home h's pool. Dynamic setting: with ``change_prob`` per
    period a home moves to another of its states: a pool in
    ``[pools[h]] + variants[pools[h]]`` (the pool after a device left or
    joined, as pool names the callable knows) times a load factor from
    ``load_scales`` (devices busy with their owners' work).
    """

    def __init__(
        self,
        pools: Sequence[str],
        sync_round_s: Callable[[str], float],
        local_steps: int | Sequence[int],
        model_bytes: int,
        uplink_bps: float,
        variants: Mapping[str, Sequence[str]] | None = None,
        load_scales: Sequence[float] = (1.0,),
        seed: int = 0,
        change_prob: float = 0.0,
        period_s: float = 60.0,
    ):
        if not pools or not uplink_bps > 0 or model_bytes < 0 or not load_scales or min(load_scales) <= 0:
            raise UserError(
                f"invalid pipeline latency model: {len(pools)} pools, uplink_bps={uplink_bps}, "
                f"model_bytes={model_bytes}, load_scales={load_scales}"
            )
        steps = np.broadcast_to(np.asarray(local_steps, dtype=int), (len(pools),))
        variants = variants or {}
        self.states = [
            [(p, float(s)) for p in [pool, *variants.get(pool, ())] for s in load_scales] for pool in pools
        ]
        self.local_steps = steps
        self.transfer_s = 2.0 * model_bytes / uplink_bps
        self._sync_round_s = sync_round_s
        self._round_cache: dict[str, float] = {}
        self.schedule = StateSchedule(
            [0] * len(pools), [len(s) for s in self.states], change_prob, period_s, seed
        )

    def state(self, home: int, t: float) -> tuple[str, float]:
        """(pool name, load factor) of ``home`` at time ``t``."""
        return self.states[home][self.schedule.index(home, t)]

    def latency(self, home: int, t: float) -> float:
        pool, load = self.state(home, t)
        if pool not in self._round_cache:
            self._round_cache[pool] = float(self._sync_round_s(pool))
        return self._round_cache[pool] * load * int(self.local_steps[home]) + self.transfer_s


class FixedLatency:
    """Given latencies per home, constant in time."""

    def __init__(self, latencies: Sequence[float]):
        self.latencies = [float(x) for x in latencies]
        if not self.latencies or min(self.latencies) < 0:
            raise UserError("fixed latencies must be a non-empty list of non-negative seconds")

    def latency(self, home: int, t: float) -> float:
        return self.latencies[home]


LATENCY_KINDS = ("paper", "pipeline", "fixed")


def make_latency_model(config: Mapping, sync_round_s: Callable[[str], float] | None = None) -> LatencyModel:
    """Build a latency model from a plain dict (the same on server and clients).

    Keys by ``kind``:

    * ``paper``: num_homes, mean_s (10), std_s (3), degrees (0.2..1.0), seed (0),
      change_prob (0), period_s (mean_s).
    * ``pipeline``: num_homes, pools (pool names; home h gets one drawn
      uniformly with ``seed``), local_steps, model_bytes, uplink_mbps,
      variants ({pool: [pool, ...]}, {}), device_dynamics (false: with true a
      home's states are its pool with one device gone or ``device_load``
      (4) times slower, :mod:`ecofl.device_dynamics`), load_scales ([1.0]), seed (0),
      change_prob (0), period_s (60), and round_s ({pool: sync-round
      seconds}, as :func:`ecofl.fl.pipeline_rounds.pipeline_round_times`
      computes them) unless a ``sync_round_s`` callable is given.
    * ``fixed``: latencies (seconds per home).
    """
    kind = config.get("kind", "paper")
    try:
        if kind == "paper":
            return PaperLatency(
                num_homes=int(config["num_homes"]),
                mean_s=float(config.get("mean_s", 10.0)),
                std_s=float(config.get("std_s", 3.0)),
                degrees=tuple(config.get("degrees", PAPER_DEGREES)),
                seed=int(config.get("seed", 0)),
                change_prob=float(config.get("change_prob", 0.0)),
                period_s=config.get("period_s"),
            )
        if kind == "pipeline":
            if sync_round_s is None and "round_s" in config:
                sync_round_s = _lookup(dict(config["round_s"]))
            if sync_round_s is None:
                raise UserError(
                    "the pipeline latency model needs round_s ({pool: seconds}) or a sync_round_s callable"
                )
            names = list(config["pools"])
            seed = int(config.get("seed", 0))
            variants = {k: list(v) for k, v in dict(config.get("variants", {})).items()}
            if config.get("device_dynamics"):
                load = float(config.get("device_load", 4.0))
                for name in names:
                    variants[name] = variants.get(name, []) + device_states(name, load)[1:]
            drawn = np.random.default_rng([seed, 1]).integers(len(names), size=int(config["num_homes"]))
            return PipelineLatency(
                pools=[names[i] for i in drawn],
                sync_round_s=sync_round_s,
                local_steps=int(config["local_steps"]),
                model_bytes=int(config["model_bytes"]),
                uplink_bps=float(config["uplink_mbps"]) * MBPS,
                variants=variants,
                load_scales=tuple(config.get("load_scales", (1.0,))),
                seed=seed,
                change_prob=float(config.get("change_prob", 0.0)),
                period_s=float(config.get("period_s", 60.0)),
            )
        if kind == "fixed":
            return FixedLatency(list(config["latencies"]))
    except KeyError as missing:
        raise UserError(f"latency model {kind!r}: missing key {missing}") from None
    raise UserError(f"unknown latency model {kind!r}; valid: {', '.join(LATENCY_KINDS)}")


def _lookup(round_s: dict[str, float]) -> Callable[[str], float]:
    """``sync_round_s`` from a table; a pool missing from it is a UserError naming the known ones."""

    def sync_round_s(pool: str) -> float:
        if pool not in round_s:
            raise UserError(f"latency config round_s has no pool {pool!r}; it has {', '.join(round_s)}")
        return float(round_s[pool])

    return sync_round_s


def pipeline_pool_states(config: Mapping) -> list[str]:
    """Every pool state a pipeline latency config can put a home in (what ``round_s`` must cover)."""
    states = list(dict.fromkeys(config["pools"]))
    for name in list(states):
        states += [v for v in dict(config.get("variants", {})).get(name, ()) if v not in states]
        if config.get("device_dynamics"):
            states += device_states(name, float(config.get("device_load", 4.0)))[1:]
    return list(dict.fromkeys(states))
