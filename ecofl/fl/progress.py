"""The event loop's progress bar: over virtual seconds when the run is time-limited, else over updates.

Each shows the other quantity and the latest accuracy beside the bar.
"""

from __future__ import annotations

from tqdm import tqdm

from ecofl.fl.loop_config import LoopConfig


class Progress:
    """A tqdm bar for one run (or nothing when ``enabled`` is False)."""

    def __init__(self, config: LoopConfig, updates: int, now: float, enabled: bool = True):
        self.limit_s = config.max_virtual_time_s
        self.bar: tqdm | None = None
        if not enabled:
            return
        if self.limit_s is None:
            self.bar = tqdm(total=config.max_updates, initial=updates, desc=config.strategy, unit="update")
        else:
            self.bar = tqdm(
                total=self.limit_s, initial=min(now, self.limit_s), desc=config.strategy, unit="virtual s",
                bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} virtual s [{elapsed}<{remaining}{postfix}]",
            )

    def show(self, updates: int, now: float, accuracy: float | None) -> None:
        if self.bar is None:
            return
        shown = "-" if accuracy is None else f"{accuracy:.3f}"
        if self.limit_s is None:
            self.bar.set_postfix(t=f"{now:.0f}s", acc=shown, refresh=False)
            self.bar.update(updates - self.bar.n)
        else:
            self.bar.set_postfix(updates=updates, acc=shown, refresh=False)
            self.bar.update(min(now, self.bar.total) - self.bar.n)

    def close(self, reached_time_limit: bool) -> None:
        if self.bar is None:
            return
        if reached_time_limit:
            self.bar.update(self.bar.total - self.bar.n)  # the next round would complete past the limit
        self.bar.close()
