"""What the event loop records (:mod:`ecofl.fl.loop`): one metrics row per global update, and the run's
summary (summary.json). Plain dictionaries, written by :func:`ecofl.fl.metrics.write_metrics`."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ecofl.fl.group_round import GroupRound, ScreenedReplies
from ecofl.fl.home_failures import HomeFailures
from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.loop_state import LoopState
from ecofl.fl.metrics import group_stats


def update_row(state: LoopState, r: GroupRound, screened: ScreenedReplies,
               evaluation: tuple[float | None, float | None], stale: int, alpha: float, busy: int, wall_s: float,
               failures: HomeFailures, round_size: int) -> dict:
    """The row of the update round ``r`` just made (``state.version`` already counts it): when its round
    started and closed against its rule, its replies, the mix (staleness, alpha), the busy and idle homes, and
    the groups' statistics."""
    loss, accuracy = evaluation
    valid = screened.valid
    return {
        "update": state.version,
        "virtual_time": r.completion,
        "round_started_s": r.start,  # clock times (virtual or run seconds): when it closed, against its rule
        "round_closed_s": r.completion,
        "deadline_s": None if r.deadline is None else r.start + r.deadline,
        "wall_time": wall_s,
        "accuracy": accuracy,
        "loss": loss,
        "group": r.group,
        "group_round": r.round,
        "homes": len(valid),
        "stragglers": screened.stragglers,
        "failed": screened.failed,
        "rejected": screened.rejected,
        "rejected_total": state.totals["rejected"],
        "staleness": stale,
        "alpha": alpha,
        "train_loss": float(np.average([x.loss for x in valid], weights=[x.num_samples for x in valid])),
        "busy_homes": busy, "idle_homes": len(state.latencies) - busy,  # training now, and the others
        "home_failures": failures.compact(),
        **group_stats(state.grouping, state.hists, state.latencies, round_size),
    }


def run_summary(config: LoopConfig, state: LoopState, num_homes: int, virtual_time_s: float,
                stop_reason: str | None, placement: dict, failures: HomeFailures) -> dict:
    """summary.json: the run's outcome (final and best accuracy, time and updates to the target), its homes,
    RT, totals, why it stopped, where the homes trained, their failures, and the loop's settings."""
    loss, accuracy = state.last_eval
    reached = state.target_reached or {}
    return {
        "strategy": config.strategy,
        "updates": state.version,
        "final_accuracy": accuracy,
        "final_loss": loss,
        "best_accuracy": state.best_accuracy,
        "target_accuracy": config.target_accuracy,
        "time_to_target_s": reached.get("virtual_time"),
        "updates_to_target": reached.get("update"),
        "virtual_time_s": virtual_time_s,
        "wall_time_s": state.wall_offset,
        "num_homes": num_homes,
        "homes_answered": len(state.latencies),  # homes that answered a profiling query (the others never trained)
        "waiting_homes": len(state.grouping.waiting) if state.grouping else None,
        "rt_s": state.rt,
        **{f"{k}_total": v for k, v in state.totals.items()},
        "stop_reason": stop_reason,
        **placement,
        "home_failures": failures.report(), "home_trainings": failures.trained,
        "config": asdict(config),
    }
