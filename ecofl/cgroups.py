"""Confining a process to a device's share of this machine with Linux cgroups: a real CPU quota and memory limit.

A confined device (``--emulate cgroup``, docs/pipeline.md) is a worker
process in a cgroup of its own whose CPU bandwidth is the device's speed in
host cores (a preset's ``speed``: 0.1 for a Jetson Nano at 10 W) and whose
memory is limited to the device's budget. Nothing sleeps to a model: the
kernel throttles the process when it has used its quota of a period and kills
it when it exceeds its memory.

Both hierarchies are supported and named in every report:

- **cgroup v2** (one unified tree): ``cpu.max`` ("quota period"),
  ``memory.max``, ``memory.swap.max``; peak ``memory.peak``; kills counted in
  ``memory.events`` (``oom_kill``);
- **cgroup v1** (a tree per controller): ``cpu.cfs_quota_us`` and
  ``cpu.cfs_period_us``; ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``: no swapping around the limit); peak
  ``memory.max_usage_in_bytes``; kills in ``memory.oom_control``.

**The period.** CFS gives a cgroup ``quota`` microseconds of CPU every
``period``. A process idle for a while (a pipeline stage waiting for its
input) may then run a whole quota at full host speed, so the shortest
period is the most faithful: the quota is held at the kernel's minimum of
1 ms and the period follows from the speed (:func:`cpu_bandwidth`): a device
of 0.1 cores gets 1 ms every 10 ms, never a 10 ms burst every 100 ms (the
kernel's default period).

New cgroups sit under this process's own (v1: per controller) and are named
``ecofl-<pid>-<label>``; :meth:`DeviceCgroup.remove` kills what is left in
one and removes it, and :func:`remove_stale` removes those of a process that
died without cleaning up (killed by SIGKILL).

``python -m ecofl.cgroups run --cores C --memory-bytes M --label L -- CMD``
runs CMD confined and removes its cgroup when CMD ends or the wrapper is
stopped (``scripts/deploy_local.sh`` starts each device daemon so);
``python -m ecofl.cgroups sweep`` removes the stale ones.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ecofl.errors import UserError

ROOT = Path("/sys/fs/cgroup")
MIN_QUOTA_US = 1000  # the kernel's smallest quota (and period): 1 ms
MAX_PERIOD_US = 1_000_000  # the kernel's longest period: 1 s
PREFIX = "ecofl-"
REMOVE_RETRY_S = 0.2  # how long remove() waits on a busy cgroup directory before it looks for processes again


@dataclass(frozen=True)
class DeviceLimits:
    """What a confined device may use: CPU in host cores, memory in bytes."""

    cores: float
    memory_bytes: int

    def __post_init__(self) -> None:
        if not self.cores > 0 or self.memory_bytes <= 0:
            raise UserError(f"a device needs positive cores and memory, got {self.cores} and {self.memory_bytes}")


def cpu_bandwidth(cores: float) -> tuple[int, int]:
    """(quota_us, period_us) giving ``cores`` of CPU, with the shortest period the kernel allows (1 ms quota)."""
    if not cores > 0:
        raise ValueError(f"cores must be positive, got {cores}")
    period = min(MAX_PERIOD_US, max(MIN_QUOTA_US, math.ceil(MIN_QUOTA_US / cores)))
    return max(MIN_QUOTA_US, round(cores * period)), period


@dataclass(frozen=True)
class Hierarchy:
    """Where this machine's cgroups are: the version and, per controller, the directory new ones go under."""

    version: int
    cpu: Path
    memory: Path

    @property
    def name(self) -> str:
        return f"cgroup v{self.version}"

    def create(self, label: str, limits: DeviceLimits) -> "DeviceCgroup":
        """A new cgroup ``ecofl-<pid>-<label>`` with ``limits`` applied."""
        name = f"{PREFIX}{os.getpid()}-{label}"
        dirs = [self.cpu / name] if self.version == 2 else [self.cpu / name, self.memory / name]
        made: list[Path] = []
        try:
            for path in dirs:
                path.mkdir()
                made.append(path)
            group = DeviceCgroup(self, dirs[0], dirs[-1])
            group.set_cores(limits.cores)
            group.set_memory(limits.memory_bytes)
        except OSError as error:
            for path in reversed(made):
                _rmdir(path)
            raise UserError(f"cannot create {self.name} {name}: {error.strerror or error}") from None
        return group


class DeviceCgroup:
    """One device's cgroup (v1: its cpu and memory directories; v2: one directory)."""

    def __init__(self, hierarchy: Hierarchy, cpu_dir: Path, memory_dir: Path):
        self.hierarchy, self.cpu_dir, self.memory_dir = hierarchy, cpu_dir, memory_dir
        self.cores = 0.0
        self.memory_limit_bytes = 0

    @property
    def dirs(self) -> list[Path]:
        return [self.cpu_dir] if self.cpu_dir == self.memory_dir else [self.cpu_dir, self.memory_dir]

    def set_cores(self, cores: float) -> None:
        """Give the cgroup ``cores`` of CPU from now on (a device slowed down: fewer cores)."""
        quota, period = cpu_bandwidth(cores)
        if self.hierarchy.version == 2:
            _write(self.cpu_dir / "cpu.max", f"{quota} {period}")
        else:
            # Shrinking the period first could make quota/period exceed a parent's: set the quota to
            # "unlimited" in between, which any period accepts.
            _write(self.cpu_dir / "cpu.cfs_quota_us", "-1")
            _write(self.cpu_dir / "cpu.cfs_period_us", str(period))
            _write(self.cpu_dir / "cpu.cfs_quota_us", str(quota))
        self.cores = quota / period

    def set_memory(self, limit_bytes: int) -> None:
        if self.hierarchy.version == 2:
            _write(self.memory_dir / "memory.max", str(limit_bytes))
            if (self.memory_dir / "memory.swap.max").exists():
                _write(self.memory_dir / "memory.swap.max", "0")
        else:
            # v1 refuses (EINVAL) a memory limit above the memory+swap one: raise memsw first, lower it last
            memory, memsw = self.memory_dir / "memory.limit_in_bytes", self.memory_dir / "memory.memsw.limit_in_bytes"
            order = [memory, memsw] if memsw.exists() else [memory]
            if memsw.exists() and limit_bytes > int(memsw.read_text() or 0):
                order.reverse()
            for path in order:
                _write(path, str(limit_bytes))
        self.memory_limit_bytes = limit_bytes

    @property
    def procs_files(self) -> list[str]:
        """The files a process writes its pid to to enter this cgroup."""
        return [str(path / "cgroup.procs") for path in self.dirs]

    def entry_command(self) -> list[str]:
        """A command prefix that moves itself into this cgroup, then runs the rest (``exec``: the same pid)."""
        procs = self.procs_files
        script = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
        return ["/bin/sh", "-c", script, "ecofl-cgroup", *procs, "--"]

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.cpu_dir / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def memory_usage_bytes(self) -> int:
        """The memory the kernel charges to the cgroup now (its own pages: not the shared libraries another
        process loaded first, which a process's resident set counts)."""
        name = "memory.current" if self.hierarchy.version == 2 else "memory.usage_in_bytes"
        return int((self.memory_dir / name).read_text().split()[0])

    def peak_memory_bytes(self) -> int | None:
        """The most memory the cgroup has held (None where the kernel does not say)."""
        path = self.memory_dir / ("memory.peak" if self.hierarchy.version == 2 else "memory.max_usage_in_bytes")
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def throttling(self) -> dict[str, int | float]:
        """CFS's record since the cgroup was made (``cpu.stat``): its periods, those it was throttled in, and the
        seconds it was held throttled; {} where the kernel does not say."""
        fields = _fields(self.cpu_dir / "cpu.stat")
        if "nr_periods" not in fields:
            return {}
        v2 = "throttled_usec" in fields
        held = int(fields["throttled_usec"]) / 1e6 if v2 else int(fields["throttled_time"]) / 1e9
        return {"cfs_periods": int(fields["nr_periods"]), "cfs_throttled_periods": int(fields["nr_throttled"]),
                "cfs_throttled_s": held}

    def oom_kills(self) -> int:
        """How many processes the kernel killed in this cgroup for exceeding its memory limit."""
        path = self.memory_dir / ("memory.events" if self.hierarchy.version == 2 else "memory.oom_control")
        return int(_fields(path).get("oom_kill", 0))

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill whatever still runs in the cgroup, then remove it (killing again what joined it meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while True:
            while pids := self.pids():
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.cpu_dir}: processes {pids} did not die")
                time.sleep(0.02)
            try:
                for path in reversed(self.dirs):
                    _rmdir(path, min(deadline, time.monotonic() + REMOVE_RETRY_S))
                return
            except OSError as error:  # busy: a process joined after the last look (or the kernel is not done)
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise


def find_hierarchy(root: Path = ROOT, self_cgroup: str | None = None) -> Hierarchy | str:
    """This machine's cgroup hierarchy with CPU and memory control, writable by us; else why not (a reason)."""
    if not root.is_dir():
        return f"no cgroup file system at {root}"
    own = own_cgroups(self_cgroup)
    if (root / "cgroup.controllers").exists():  # v2 alone
        return _v2(root, own.get("", "/"))
    if {"cpu", "memory"} <= own.keys() and (root / "cpu").is_dir() and (root / "memory").is_dir():
        cpu, memory = root / "cpu" / own["cpu"].lstrip("/"), root / "memory" / own["memory"].lstrip("/")
        for path in (cpu, memory):
            if not os.access(path, os.W_OK):
                return f"{path} is not writable (run as root to confine devices)"
        return Hierarchy(1, cpu, memory)
    if (root / "unified" / "cgroup.controllers").exists():  # hybrid: v2 may still hold the controllers
        return _v2(root / "unified", own.get("", "/"))
    return f"no cgroup with the cpu and memory controllers under {root}"


def _v2(root: Path, own: str) -> Hierarchy | str:
    controllers = (root / "cgroup.controllers").read_text().split()
    if not {"cpu", "memory"} <= set(controllers):
        return f"cgroup v2 at {root} lacks the cpu or memory controller (has: {' '.join(controllers) or 'none'})"
    # A v2 cgroup with processes of its own cannot enable controllers for children: ours go in a
    # sub-tree of the root that holds no process.
    parent = root / f"{PREFIX}devices"
    try:
        parent.mkdir(exist_ok=True)
        for path in (root, parent):
            enabled = (path / "cgroup.subtree_control").read_text().split()
            if not {"cpu", "memory"} <= set(enabled):
                _write(path / "cgroup.subtree_control", "+cpu +memory")
    except OSError as error:
        return f"cannot delegate cpu and memory in cgroup v2 at {root}: {error.strerror or error}"
    return Hierarchy(2, parent, parent)


def own_cgroups(text: str | None = None) -> dict[str, str]:
    """Controller -> this process's cgroup path (v2's entry under the key ""), from ``text`` (default: its
    ``/proc/self/cgroup``)."""
    if text is None:
        try:
            text = Path("/proc/self/cgroup").read_text()
        except OSError:
            return {}
    own: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own


def remove_stale(hierarchy: Hierarchy) -> list[str]:
    """Remove the cgroups of ecofl processes that no longer run (a portal killed with SIGKILL); their names."""
    removed = []
    for parent in {hierarchy.cpu, hierarchy.memory}:
        for path in parent.glob(f"{PREFIX}*-*"):
            match = re.fullmatch(rf"{PREFIX}(\d+)-.+", path.name)
            if match is None or _alive(int(match.group(1))):
                continue
            group = DeviceCgroup(hierarchy, path, path)
            try:
                group.remove(timeout_s=2.0)
                removed.append(path.name)
            except (OSError, RuntimeError):
                pass
    return sorted(set(removed))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fields(path: Path) -> dict[str, str]:
    """A cgroup file of ``key value`` lines as a dict ({} where it cannot be read)."""
    try:
        return dict(line.split() for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return {}


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _rmdir(path: Path, deadline: float | None = None) -> None:
    """Remove a cgroup directory (the kernel may take a moment after its last process exits)."""
    deadline = time.monotonic() + 2.0 if deadline is None else deadline
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if error.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def run_confined(command: list[str], label: str, limits: DeviceLimits) -> int:
    """Run ``command`` in a cgroup of its own under ``limits``; SIGTERM and SIGINT are passed on, and the
    cgroup is removed (with anything left in it) when the command ends. The command's exit status."""
    found = find_hierarchy()
    if isinstance(found, str):
        raise UserError(f"cannot confine {label}: {found}")
    remove_stale(found)
    group = found.create(label, limits)
    try:
        child = subprocess.Popen(group.entry_command() + command)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda number, _frame: child.send_signal(number))
        return child.wait()
    finally:
        group.remove()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ecofl.cgroups", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a command confined to CPU cores and memory, then remove its cgroup")
    run.add_argument("--cores", type=float, required=True)
    run.add_argument("--memory-bytes", type=int, required=True)
    run.add_argument("--label", required=True, help="in the cgroup's name: ecofl-<pid>-<label>")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- the command")
    commands.add_parser("sweep", help="remove the cgroups of ecofl processes that no longer run")
    args = parser.parse_args(argv)
    try:
        if args.command == "sweep":
            found = find_hierarchy()
            removed = [] if isinstance(found, str) else remove_stale(found)
            print(" ".join(removed))
            return 0
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            parser.error("run needs a command after --")
        return run_confined(command, args.label, DeviceLimits(args.cores, args.memory_bytes))
    except UserError as error:
        print(f"ecofl.cgroups: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
