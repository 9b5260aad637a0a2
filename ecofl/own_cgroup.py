"""What a process reads of the cgroup it runs in: its memory limit (a device daemon's budget) and, in a
device's cgroup (:mod:`ecofl.cgroups`), its CPU quota in cores (a confined worker's pace,
:mod:`ecofl.pipeline.runtime.cpu_pace`)."""

from __future__ import annotations

from pathlib import Path

from ecofl.cgroups import PREFIX, ROOT, own_cgroups


def own_memory_limit_bytes(root: Path = ROOT) -> int | None:
    """The memory limit of the cgroup this process runs in (None: unlimited, or no cgroup to read)."""
    own = own_cgroups(None)
    candidates = [root / own.get("", "/").lstrip("/") / "memory.max"]
    if "memory" in own:
        candidates.insert(0, root / "memory" / own["memory"].lstrip("/") / "memory.limit_in_bytes")
    for path in candidates:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text != "max" and int(text) < 1 << 60:  # v1 writes "unlimited" as a number near 2**63
            return int(text)
    return None


def own_device_cores(root: Path = ROOT, self_cgroup: str | None = None) -> float | None:
    """The CPU quota in cores of the device cgroup this process runs in (one named ``ecofl-<pid>-<label>``);
    None outside one, or where it has no quota."""
    own = own_cgroups(self_cgroup)
    path = own.get("cpu", own.get(""))
    if path is None or not Path(path).name.startswith(PREFIX):
        return None
    relative = path.lstrip("/")
    if "cpu" in own:  # v1
        files = [(root / "cpu" / relative / "cpu.cfs_quota_us", root / "cpu" / relative / "cpu.cfs_period_us")]
    else:  # v2 alone, or a hybrid's unified tree
        files = [(directory / "cpu.max", None) for directory in (root / relative, root / "unified" / relative)]
    for quota_file, period_file in files:
        try:
            if period_file is None:
                quota_text, period_text = quota_file.read_text().split()
            else:
                quota_text, period_text = quota_file.read_text(), period_file.read_text()
        except OSError:
            continue
        quota = -1 if quota_text.strip() == "max" else int(quota_text)
        return quota / int(period_text) if quota > 0 else None
    return None
