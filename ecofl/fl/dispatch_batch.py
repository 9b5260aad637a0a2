"""Which homes of one dispatch may train together: same starting model, same settings but their seeds.

The event loop sends a dispatch's rounds in one ``Transport.train`` call (or
one ``submit`` of the dispatch, ``batched``): every home of it gets the current global model and the loop's training
settings, each with a seed of its own. Those homes can be trained as one
vectorised computation (:mod:`ecofl.batched_training`) with no change to
what any of them computes. :func:`dispatch_batches` groups a call's tasks
into such batches; a transport sends each home its :class:`DispatchBatch`
(the homes and seeds of its batch), so whichever process serves the first of
them can train them all (``client.dispatch_batches``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ecofl.fl.transport import TrainTask


@dataclass(frozen=True)
class DispatchBatch:
    """The homes that train together, each with its task's seed; ``id`` names the batch within the run."""

    id: str
    homes: tuple[int, ...]
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.homes) != len(self.seeds) or len(set(self.homes)) != len(self.homes):
            raise ValueError(f"a dispatch batch needs one seed per home and no home twice: {self}")

    def seed_of(self, home: int) -> int:
        return self.seeds[self.homes.index(home)]


def settings_but_seed(train: dict) -> tuple:
    """A task's training settings without its seed, as a hashable key."""
    return tuple(sorted((k, v) for k, v in train.items() if k != "seed"))


def dispatch_batches(tasks: Sequence[TrainTask], prefix: str) -> dict[int, DispatchBatch]:
    """Each home's batch among ``tasks``: tasks sharing one weights object and their settings but the seed.

    Batch ids are ``prefix`` plus a counter in first-seen order, so ``prefix``
    must be unique per ``train`` call within a run. Homes alone in their batch,
    and a home's second task in one call, are left out (they train on their own).
    """
    groups: dict[tuple, list[TrainTask]] = {}
    seen: set[int] = set()
    for task in tasks:
        if task.home not in seen:
            groups.setdefault((id(task.weights), settings_but_seed(task.train)), []).append(task)
        seen.add(task.home)
    out: dict[int, DispatchBatch] = {}
    for number, members in enumerate(g for g in groups.values() if len(g) > 1):
        batch = DispatchBatch(f"{prefix}.{number}", tuple(t.home for t in members),
                              tuple(int(t.train.get("seed", 0)) for t in members))
        out.update((t.home, batch) for t in members)
    return out
