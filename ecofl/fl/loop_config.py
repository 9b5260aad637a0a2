"""The event loop's settings, checked on construction (Eco-FL §5; docs/architecture.md).

Validation needs only names (the strategies, the staleness functions), so
this module imports no strategy: :mod:`ecofl.fl.strategies` builds its
policies from a :class:`LoopConfig`, not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ecofl.errors import UserError
from ecofl.fl.aggregation import STALENESS_FUNCTIONS
from ecofl.fl.grouping import LATENCY_UNITS

#: The strategies of :mod:`ecofl.fl.strategies` (Eco-FL and the baselines of §6).
STRATEGIES = ("ecofl", "ecofl_wo_dg", "fedavg", "fedasync", "fedat", "astraea", "fedat_equal_weights")
#: How long a group round waits for its homes (:meth:`LoopConfig.round_deadline_s`).
ROUND_DEADLINES = ("rt", "none", "factor")

#: Fields with a lower bound (an int at least this).
_AT_LEAST = (
    ("num_groups", 1), ("homes_per_round", 1), ("max_concurrent", 1), ("max_updates", 1),
    ("eval_every", 1), ("requery_every", 0), ("checkpoint_every", 0),
)
#: Optional fields that must be positive when set.
_POSITIVE_OR_NONE = ("rt", "eval_every_s", "round_deadline_factor")


@dataclass(frozen=True)
class LoopConfig:
    """Settings of the event loop.

    ``rt`` (seconds): Eco-FL's latency threshold; None derives it from the
    queried latencies (:func:`ecofl.fl.grouping.derive_rt`: the larger of the
    mean gap between adjacent K-means centres and the largest home-to-centre
    distance) times ``rt_scale``, which widens (> 1) or narrows the range a
    group may reach into its neighbours for label balance.
    ``round_deadline``: how long a synchronous group round waits, the same
    rule for every strategy that has such rounds (all but FedAsync, whose
    updates are single homes applied as they arrive):
    ``rt`` (the default) waits ``centre + RT`` seconds on the virtual clock,
    the group's latency centre plus the threshold Eco-FL bounds its groups
    with, and replies later than that are stragglers left out of the round;
    ``none`` waits for every home; ``factor`` waits
    ``round_deadline_factor * centre``. On the wall clock ``rt`` waits for
    every home, because there the latencies the grouping uses are training
    times without communication (:mod:`ecofl.fl.loop`).
    ``fresh_staleness``: the staleness of an update applied right after the
    version it started from, 1 as in Xie et al. (t - tau, t the version the
    update produces; :func:`ecofl.fl.aggregation.staleness`) or 0 (count only
    the updates applied in between); it feeds the staleness function of every
    policy that mixes with alpha * s(staleness).
    ``requery_every``: updates between latency queries of all homes for
    re-grouping (0: only the latencies replies report; policies that do not
    re-group never re-query). ``train``: local training settings sent to
    every home (``TrainTask.train``: epochs, batch_size, lr, mu, ...).
    ``evaluate`` runs every ``eval_every`` updates, or, with ``eval_every_s``
    set, on the first update at or past each multiple of ``eval_every_s``
    seconds of (virtual) time, so runs whose update rates differ a hundredfold
    (FedAvg, FedAsync) get curves of the same density; and on the last update,
    whatever stopped the run.
    """

    strategy: str = "ecofl"
    num_groups: int = 5
    homes_per_round: int = 4  # k per group round
    max_concurrent: int = 20
    rt: float | None = None
    rt_scale: float = 1.0
    lam: float = 1.0
    latency_units: str = "rt"  # eq. 4's latency term over RT, or in seconds (:mod:`ecofl.fl.grouping`)
    alpha: float = 0.6
    staleness: str = "polynomial"
    staleness_a: float = 0.5
    staleness_b: float = 4.0
    fresh_staleness: int = 1
    max_updates: int = 100
    max_virtual_time_s: float | None = None
    target_accuracy: float | None = None
    stop_at_target: bool = True  # False: record the time to target and run on to the other limits
    eval_every: int = 1
    eval_every_s: float | None = None
    requery_every: int = 10
    checkpoint_every: int = 0
    seed: int = 0
    round_deadline: str = "rt"
    round_deadline_factor: float | None = None
    train: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UserError(f"unknown strategy {self.strategy!r}; valid strategies: {', '.join(STRATEGIES)}")
        problems = [f"{name} must be at least {low}" for name, low in _AT_LEAST if getattr(self, name) < low]
        problems += [f"{name} must be positive" for name in _POSITIVE_OR_NONE
                     if getattr(self, name) is not None and not getattr(self, name) > 0]
        if not self.rt_scale > 0:
            problems.append("rt_scale must be positive")
        if self.lam < 0:
            problems.append("lam must be non-negative")
        if self.latency_units not in LATENCY_UNITS:
            problems.append(f"latency_units must be one of {', '.join(LATENCY_UNITS)}")
        if not 0 < self.alpha <= 1:
            problems.append("alpha must lie in (0, 1]")
        if self.staleness not in STALENESS_FUNCTIONS:
            problems.append(f"staleness must be one of {', '.join(STALENESS_FUNCTIONS)}")
        if self.fresh_staleness not in (0, 1):
            problems.append("fresh_staleness must be 1 (Xie et al.) or 0")
        if self.round_deadline not in ROUND_DEADLINES:
            problems.append(f"round_deadline must be one of {', '.join(ROUND_DEADLINES)}")
        elif (self.round_deadline == "factor") != (self.round_deadline_factor is not None):
            problems.append("round_deadline_factor is set exactly when round_deadline is factor")
        if problems:
            raise UserError("invalid loop config: " + "; ".join(problems))


    def round_deadline_s(self, centre: float, rt: float | None, virtual_clock: bool) -> float | None:
        """Seconds a synchronous round of a group centred at ``centre`` waits for its homes (None: all of them)."""
        if self.round_deadline == "factor":
            return self.round_deadline_factor * centre
        if self.round_deadline == "rt" and virtual_clock and rt is not None:
            return centre + rt
        return None


def loop_config_fields() -> tuple[str, ...]:
    """The names of :class:`LoopConfig`'s fields (the server's config sections are checked against them)."""
    return tuple(f.name for f in fields(LoopConfig))
