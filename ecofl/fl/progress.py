"""The event loop's progress bar, over the quantity whose limit ends the run.

A run that stops at a target accuracy shows the best accuracy so far
against the target; one limited in virtual time shows virtual seconds;
otherwise updates against ``max_updates``. Whatever the bar counts, the
other quantities stand beside it, and the estimate of the time left is
tqdm's, made toward that limit (for accuracy, which rises ever more slowly,
it is an early guess). ``max_updates`` still ends a run that reaches it first.

With a ``file`` instead of a terminal (a ServerApp in a process of its own,
``server/run_files.py``) every update is written there as JSON, and the
process that submitted the run draws the bar from it (:func:`show_from`).
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm import tqdm

from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.metrics import write_json


class Progress:
    """A tqdm bar for one run (or nothing when ``enabled`` is False)."""

    def __init__(self, config: LoopConfig, updates: int, now: float, enabled: bool = True, file: Path | None = None):
        self.config = config
        self.file = file
        if file is not None:
            enabled = False
        self.by = "updates"
        if config.stop_at_target and config.target_accuracy is not None:
            self.by = "accuracy"
        elif config.max_virtual_time_s is not None:
            self.by = "time"
        self.bar: tqdm | None = None
        if not enabled:
            return
        desc = config.strategy
        if self.by == "accuracy":
            self.bar = tqdm(total=round(100 * config.target_accuracy, 1), desc=desc, unit="% accuracy",
                            bar_format="{l_bar}{bar}| best {n:.1f}/{total:.0f}% accuracy "
                                       "[{elapsed}<{remaining}{postfix}]")
        elif self.by == "time":
            limit = config.max_virtual_time_s
            self.bar = tqdm(total=limit, initial=min(now, limit), desc=desc, unit="virtual s",
                            bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} virtual s [{elapsed}<{remaining}{postfix}]")
        else:
            self.bar = tqdm(total=config.max_updates, initial=updates, desc=desc, unit="update")

    def show(self, updates: int, now: float, accuracy: float | None, best: float | None = None) -> None:
        if self.file is not None:
            write_json(self.file, {"updates": updates, "now": now, "accuracy": accuracy, "best": best})
        if self.bar is None:
            return
        shown = "-" if accuracy is None else f"{accuracy:.3f}"
        if self.by == "accuracy":
            self.bar.set_postfix(updates=f"{updates}/{self.config.max_updates}", t=f"{now:.0f}s", acc=shown,
                                 refresh=False)
            self.bar.update(min(100 * (best or 0.0), self.bar.total) - self.bar.n)
        elif self.by == "time":
            self.bar.set_postfix(updates=updates, acc=shown, refresh=False)
            self.bar.update(min(now, self.bar.total) - self.bar.n)
        else:
            self.bar.set_postfix(t=f"{now:.0f}s", acc=shown, refresh=False)
            self.bar.update(updates - self.bar.n)

    def close(self, reached_time_limit: bool) -> None:
        if self.bar is None:
            return
        if reached_time_limit and self.by == "time":
            self.bar.update(self.bar.total - self.bar.n)  # the next round would complete past the limit
        self.bar.close()


def show_from(bar: Progress, file: Path) -> None:
    """Draw on ``bar`` the progress another process wrote to ``file`` (nothing before its first update)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return
    bar.show(data["updates"], data["now"], data["accuracy"], data["best"])
