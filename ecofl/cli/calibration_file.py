"""A confined home's calibration kept in a file, so that runs compared side by side share one plan.

``ecofl home train --emulate cgroup`` measures every device in its cgroup
and plans on what it measured (:func:`ecofl.pipeline.runtime.calibration.plan_on_measured_speeds`).
Two runs therefore plan on two measurements, and a comparison of them (with
and without ``--fault-tolerance``, say) moves with the measurement as much as
with the factor compared. With ``--calibration FILE`` the first run writes
the devices' measured speeds and the plan made from them to FILE, and every
later run with the same FILE and the same settings plans nothing: it reuses
them, so its prediction and plan are the first run's. A FILE made for another
model, pool, mini-batch, planner or schedule is refused with what differs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ecofl.devices import HomePool
from ecofl.errors import UserError
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.replan import with_speeds
from ecofl.pipeline.runtime.calibration import ConfinedPool, plan_workload
from ecofl.pipeline.runtime.confinement import pool_limits

VERSION = 2  # 2: speeds over the step as the cost model counts it, per-operation overhead included (2026-12-03)


def save_calibration(path: Path, settings: dict, confined: ConfinedPool, plan: Plan) -> None:
    """Write ``confined``'s measured speeds and ``plan`` to ``path``, under the ``settings`` they hold for."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "version": VERSION, "settings": settings, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "speeds": [spec.speed for spec in confined.pool.devices],
        "measured": {str(device): report for device, report in confined.measured.items()},
        "plan": plan.to_dict(),
    }, indent=2) + "\n")


def load_calibration(path: Path, settings: dict, presets: HomePool) -> tuple[ConfinedPool, Plan, str]:
    """The confined pool and plan saved in ``path`` for ``settings`` (the presets' limits, the measured
    speeds), and when they were measured; UserError if ``path`` is not such a file or holds other settings."""
    try:
        saved = json.loads(path.read_text())
        if saved.get("version") != VERSION:
            raise ValueError(f"version {saved.get('version')!r}, not {VERSION}")
        speeds = [float(speed) for speed in saved["speeds"]]
        plan = _plan(saved["plan"])
        measured = {int(device): dict(report) for device, report in saved["measured"].items()}
        first_touch = {device: _seconds_or_none(report.get("first_touch_s_per_byte"))
                       for device, report in measured.items()}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a calibration file of ecofl home train: {error}") from None
    differ = {key: (saved["settings"].get(key), value) for key, value in settings.items()
              if saved["settings"].get(key) != value}
    if differ:
        raise UserError(f"{path} was calibrated for other settings ("
                        + ", ".join(f"{key} {was!r}, not {now!r}" for key, (was, now) in differ.items())
                        + "): give another file, or delete it to calibrate again")
    if len(speeds) != len(presets.devices):
        raise UserError(f"{path} holds {len(speeds)} devices, the pool {len(presets.devices)}")
    limits = pool_limits(presets)
    pool = with_speeds(presets, dict(enumerate(speeds)), first_touch, {d: limit.cores for d, limit in limits.items()})
    workload = plan_workload(plan, range(len(speeds)))  # what the saved speeds were measured on
    return ConfinedPool(pool, limits, measured, workload), plan, saved["measured_at"]


def _seconds_or_none(value: object) -> float | None:
    """A measured figure of the file: None, or a number of seconds at least 0 (ValueError otherwise)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"a device's first_touch_s_per_byte is {value!r}, not seconds")
    return float(value)


def _plan(data: dict) -> Plan:
    stages = tuple(StagePlan(tuple(s["layers"]), tuple(s["devices"]), tuple(s["shares"]), int(s["in_flight"]))
                   for s in data["stages"])
    return Plan(data["planner"], stages, int(data["micro_batch"]), int(data["num_micro_batches"]),
                schedule=data["schedule"])
