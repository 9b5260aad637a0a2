"""What every home command reports of a plan's stages: where each stage runs, as JSON fields and as a text table."""

from __future__ import annotations

from ecofl.devices import HomePool
from ecofl.pipeline.plan import StagePlan

PLACEMENT_HEAD = ("stage", "devices", "layers", "share")


def stage_placement(s: int, stage: StagePlan, pool: HomePool) -> dict:
    """Stage ``s``: its devices (by index and name), its layers, each device's share of a micro-batch and the
    micro-batches it holds in flight (K_p); the first fields of the stage's report."""
    return {
        "stage": s,
        "devices": list(stage.devices),
        "device_names": [pool.devices[d].name for d in stage.devices],
        "layers": list(stage.layers),
        "shares": list(stage.shares),
        "in_flight": stage.in_flight,
    }


def placement_cells(stage: dict) -> tuple[str, ...]:
    """A stage report's placement as the cells under :data:`PLACEMENT_HEAD`."""
    return (
        str(stage["stage"]),
        ",".join(f"{d}:{n}" for d, n in zip(stage["devices"], stage["device_names"])),
        f"{stage['layers'][0]}-{stage['layers'][1]}",
        "+".join(map(str, stage["shares"])),
    )


def aligned(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` (the head first) as lines of left-aligned columns, a rule under the head."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
