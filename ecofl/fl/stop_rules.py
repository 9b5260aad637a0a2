"""When the event loop evaluates the global model and when it stops.

Evaluation runs every ``eval_every`` updates, or with ``eval_every_s`` on
the first update at or past each multiple of that many (virtual) seconds,
and always on the last update. The run stops at ``max_updates``, at the
virtual time limit (the next round would complete past it), at the target
accuracy (if ``stop_at_target``), when no group can train, after
:data:`MAX_EMPTY_ROUNDS` rounds in a row without a valid update, or when
the transport is stopped (:data:`STOPPED`).
"""

from __future__ import annotations

from ecofl.fl.loop_config import LoopConfig
from ecofl.fl.loop_state import LoopState

#: Stop when this many group rounds in a row produced no valid update (every home failing).
MAX_EMPTY_ROUNDS = 50
#: ``stop_reason`` of a run whose transport was stopped (Ctrl-C).
STOPPED = "stopped"
MAX_VIRTUAL_TIME = "max_virtual_time_s"


def evaluation_due(state: LoopState, config: LoopConfig, at: float) -> bool:
    """Whether the update just applied at time ``at`` is evaluated."""
    if state.version >= config.max_updates:
        return True
    period = config.eval_every_s
    if period is None:
        return state.version % config.eval_every == 0
    last = next((row["virtual_time"] for row in reversed(state.rows) if row["accuracy"] is not None), 0.0)
    return at // period > last // period


def record_evaluation(state: LoopState, config: LoopConfig, loss: float, accuracy: float, at: float) -> None:
    """Remember an evaluation: the latest, the best accuracy, and when the target was first reached."""
    state.last_eval = (float(loss), float(accuracy))
    if state.best_accuracy is None or accuracy > state.best_accuracy:
        state.best_accuracy = float(accuracy)
    target = config.target_accuracy
    if target is not None and state.target_reached is None and accuracy >= target:
        state.target_reached = {"virtual_time": at, "update": state.version}


def stop_before_next(state: LoopState, config: LoopConfig, rounds_in_flight: int, busy_homes: int) -> str | None:
    """Why no further round can be applied, or None (nothing in flight but busy homes: wait for them)."""
    if state.version >= config.max_updates:
        return "max_updates"
    if not rounds_in_flight and not busy_homes:
        return "no home can train (all waiting)"
    return None


def past_time_limit(config: LoopConfig, completion: float) -> bool:
    """Whether a round completing at ``completion`` lies past the virtual time limit."""
    return config.max_virtual_time_s is not None and completion > config.max_virtual_time_s


def stop_after_update(state: LoopState, config: LoopConfig) -> str | None:
    """Why the run ends after the round just applied (so no round is sent that would never be applied)."""
    if config.stop_at_target and state.target_reached is not None:
        return "target_accuracy"
    if state.version >= config.max_updates:
        return "max_updates"
    if state.empty_rounds >= MAX_EMPTY_ROUNDS:
        return f"{MAX_EMPTY_ROUNDS} group rounds in a row without a valid update"
    return None
