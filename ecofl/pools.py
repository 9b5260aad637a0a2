"""Home pools as data: the named pools in ``conf/home/*.yaml`` and a user's own home in a YAML file.

Device *presets* live in code (:data:`ecofl.devices.PRESETS`); a *pool* (the
devices of one home) is a YAML file::

    name: my-home                 # optional; default: the file's name
    bandwidth_mbps: 100           # optional: every device's link unless it says otherwise
    devices:
      - nano-10w                  # a preset, as it is
      - preset: tx2-maxn          # a preset with changes
        bandwidth_mbps: 1000
      - name: my-laptop           # a device of its own
        speed: 0.3                # relative to one host core (ecofl.devices)
        memory_gb: 8
        bandwidth_mbps: 300
      - name: my-board            # the same, said as what a confined device gets
        cores: 0.25               # its CPU quota in host cores (= speed; --emulate cgroup)
        memory_gb: 2              # its memory budget for training (the limit is this + its runtime)
      - name: desk-gpu            # a device that trains its stage on its GPU
        speed: 1.0
        memory_gb: 8              # for a GPU: its memory (the planner's budget)
        accelerator: cuda         # or cuda:N; default cpu. Without a GPU here: one line, exit 2

To match a real board: time one layer (or the whole model) on the board and
on one core of the machine that profiles, and give the board
``cores = host time / board time`` (docs/pipeline.md, "Confined devices").

Device 0 is the portal (it holds the home's data). The named pools are the
files in ``conf/home/`` (Asteroid's Env A-D and Eco-FL's testbeds); wherever
a pool name is accepted (``ecofl plan --pool``, ``ecofl home train --pool``,
``pipeline_home.pool``, ``latency.pools``) a path to such a file is too. A
bad file is a :class:`~ecofl.errors.UserError` that names the file and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ecofl.devices import ACCELERATOR, GB, MBPS, PRESETS, DeviceSpec, HomePool, make_pool, preset
from ecofl.errors import UserError

#: Where the named pools live: ``conf/home`` of the repository this package belongs to.
POOLS_DIR = Path(__file__).resolve().parent.parent / "conf" / "home"
#: Link bandwidth of a device whose file and preset name none (Eco-FL §6.1, Asteroid §5.1).
DEFAULT_BANDWIDTH_MBPS = 100.0

_POOL_KEYS = {"name", "bandwidth_mbps", "devices"}
_DEVICE_KEYS = {"preset", "name", "speed", "cores", "memory_gb", "bandwidth_mbps", "accelerator"}


def pool_names() -> list[str]:
    """The named pools (files of ``conf/home``)."""
    if not POOLS_DIR.is_dir():
        raise UserError(f"the named home pools are missing: no directory {POOLS_DIR}")
    return sorted(p.stem for p in POOLS_DIR.glob("*.yaml"))


def is_pool_file(text: str) -> bool:
    """Whether ``text`` names a pool file rather than a named pool or presets."""
    return text.endswith((".yaml", ".yml")) or "/" in text


def load_pool(text: str, bandwidth_mbps: float | None = None) -> HomePool:
    """A named pool, a pool file, or comma-separated presets (``nano-10w,tx2-maxn``).

    ``bandwidth_mbps`` sets every link; otherwise the file's (default 100 Mbps).
    """
    if bandwidth_mbps is not None and not bandwidth_mbps > 0:
        raise UserError(f"bandwidth must be positive, got {bandwidth_mbps} Mbps")
    if is_pool_file(text):
        pool = read_pool_file(text)
    elif text in pool_names():
        pool = read_pool_file(POOLS_DIR / f"{text}.yaml")
    else:
        pool = _preset_pool(text)
    return pool if bandwidth_mbps is None else pool.with_bandwidth(bandwidth_mbps)


def _preset_pool(text: str) -> HomePool:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise UserError(f"empty pool {text!r}: name a pool ({', '.join(pool_names())}), a pool file or presets")
    unknown = [name for name in names if name not in PRESETS]
    if unknown:
        raise UserError(
            f"unknown pool or device preset {unknown[0]!r}; pools: {', '.join(pool_names())} or a YAML file "
            f"(docs/pipeline.md); presets: {', '.join(PRESETS)}"
        )
    return make_pool(text, names, DEFAULT_BANDWIDTH_MBPS)


def read_pool_file(path: str | Path) -> HomePool:
    """Parse a pool file; every problem is a UserError naming the file and the field."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as error:
        raise UserError(f"cannot read home pool file {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UserError(f"{path}: not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a home pool file is a mapping with 'devices' (and optionally 'name', "
                        f"'bandwidth_mbps')")
    _no_unknown(path, "", data, _POOL_KEYS)
    devices = data.get("devices")
    if not isinstance(devices, list) or not devices:
        raise UserError(f"{path}: 'devices' must be a non-empty list of presets or device mappings")
    default = _positive(path, "bandwidth_mbps", data.get("bandwidth_mbps", DEFAULT_BANDWIDTH_MBPS))
    specs = tuple(_device(path, f"devices[{i}]", entry, default) for i, entry in enumerate(devices))
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise UserError(f"{path}: 'name' must be a non-empty string")
    return HomePool(name=name, devices=specs)


def _device(path: Path, where: str, entry: Any, bandwidth_mbps: float) -> DeviceSpec:
    if isinstance(entry, str):
        entry = {"preset": entry}
    if not isinstance(entry, dict):
        raise UserError(f"{path}: {where} must be a preset name or a mapping, got {entry!r}")
    _no_unknown(path, f"{where}.", entry, _DEVICE_KEYS)
    if "cores" in entry:  # a confined device's quota: the same number as its speed
        if "speed" in entry:
            raise UserError(f"{path}: {where} gives both 'speed' and 'cores' (they are the same number: give one)")
        entry = {("speed" if k == "cores" else k): v for k, v in entry.items()}
    if "preset" in entry:
        try:
            base = preset(str(entry["preset"]))
        except UserError as error:
            raise UserError(f"{path}: {where}.preset: {error}") from None
        speed, memory, name = base.speed, base.memory_bytes, base.name
    else:
        missing = [k for k in ("name", "speed", "memory_gb") if k not in entry]
        if missing:
            raise UserError(f"{path}: {where} needs 'preset', or 'name', 'speed' (or 'cores') and 'memory_gb' (missing "
                            f"{', '.join(missing)})")
        speed, memory, name = None, None, None
    speed = _positive(path, f"{where}.speed", entry.get("speed", speed))
    memory = int(_positive(path, f"{where}.memory_gb", entry["memory_gb"]) * GB) if "memory_gb" in entry else memory
    link = _positive(path, f"{where}.bandwidth_mbps", entry.get("bandwidth_mbps", bandwidth_mbps))
    accelerator = entry.get("accelerator", "cpu")
    if not isinstance(accelerator, str) or not ACCELERATOR.fullmatch(accelerator):
        raise UserError(f"{path}: {where}.accelerator must be cpu, cuda or cuda:N, got {accelerator!r}")
    return DeviceSpec(name=str(entry.get("name", name)), speed=speed, memory_bytes=memory, bandwidth_bps=link * MBPS,
                      accelerator=accelerator)


def _positive(path: Path, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise UserError(f"{path}: {field} must be a positive number, got {value!r}")
    return float(value)


def _no_unknown(path: Path, prefix: str, data: dict, known: set[str]) -> None:
    unknown = sorted(set(map(str, data)) - known)
    if unknown:
        raise UserError(f"{path}: unknown field {prefix}{unknown[0]} (valid: {', '.join(sorted(known))})")
