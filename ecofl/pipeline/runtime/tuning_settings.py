"""What a home pipeline is asked to re-tune: when, by how much at least, with which planner (the decision is
:mod:`.pipeline_tuning`'s)."""

from __future__ import annotations

from dataclasses import dataclass

from ecofl.errors import UserError


@dataclass(frozen=True)
class Tuning:
    """Re-tune the plan after its first ``after_rounds`` sync-rounds (at least 2: a plan's first is a warm-up),
    then, with ``every_rounds``, again every ``every_rounds`` sync-rounds (FTPipeHD §III-D re-partitions after its
    first 10 batches, then every 100; 0: once).

    ``planner``: the one that re-plans (None: the plan's own); ``micro_batch``: keep this size (None: let the
    candidates differ in it); ``margin``: the predicted gain below which the plan is kept."""

    after_rounds: int = 2
    every_rounds: int = 0
    margin: float = 0.05
    planner: str | None = None
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        if self.after_rounds < 2:
            raise UserError(f"tuning needs a warm-up round and a measured one: after_rounds >= 2, got "
                            f"{self.after_rounds}")
        if self.every_rounds == 1 or self.every_rounds < 0:
            raise UserError(f"re-tuning again needs a measured round past a new plan's warm-up: every_rounds >= 2 "
                            f"(or 0: once), got {self.every_rounds}")
        if not 0 <= self.margin < 1:
            raise UserError(f"the tuning margin is a fraction in [0, 1), got {self.margin}")
