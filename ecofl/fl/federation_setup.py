"""The description of a federation that every message carries: the server's half of the contract.

A simulated federation is described by one :class:`FederationSetup` (the
dataset, how it is split over the homes, the model, the latency model, which
homes train through the real pipeline). The server sends its JSON with every
message, so a Ray actor that serves many homes needs no configuration of its
own: the client side (``client/federation.py``) decodes the dataset once per
process and setup, and each home indexes its own part.

:class:`PipelineHomeSettings` is the ``pipeline_home`` section: which homes
train through the multi-process pipeline runtime instead of in one process,
on which device pool, with which planner.

Plain data and JSON only: nothing here imports Flower (the Flower records
are built in ``protocol/``, which both ``server/`` and ``client/`` import).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ecofl.accelerator import check_device_spec
from ecofl.errors import UserError
from ecofl.pools import load_pool
from ecofl.fl.latency import PipelineLatency
from ecofl.pipeline.planners import check_planner


@dataclass(frozen=True)
class FederationSetup:
    """The shared description of a simulated federation of ``num_homes`` homes.

    ``dataset`` holds :func:`ecofl.data.load_dataset`'s keyword arguments,
    ``partition`` :func:`ecofl.data.partition.partition`'s (``scheme`` and its
    options, as in ``conf/partition``), ``model`` a model ``name`` and its
    ``options`` (``conf/model``), ``latency`` the latency model's config
    (``conf/latency``; empty: measured wall-clock time), ``pipeline_home``
    which homes train through the real pipeline runtime instead of in one
    process (:class:`PipelineHomeSettings`; empty: none). ``device`` is where a
    home's ClientApp trains (:mod:`ecofl.accelerator`; ``auto``: the
    accelerator its process was given, else the CPU) and ``batch_homes``
    whether the homes of one dispatch train as one computation
    (:data:`BATCH_HOMES`; :mod:`client.dispatch_batches`).
    """

    num_homes: int = 300
    dataset: dict = field(default_factory=lambda: {"name": "fashion_mnist"})
    partition: dict = field(default_factory=lambda: {"scheme": "shards", "classes_per_client": 2})
    model: dict = field(default_factory=lambda: {"name": "cnn", "options": {}})
    latency: dict = field(default_factory=dict)
    seed: int = 0
    pipeline_home: dict = field(default_factory=dict)
    device: str = "auto"
    batch_homes: str = "auto"

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FederationSetup:
        """Parse a setup; unknown or malformed fields are a :class:`UserError`."""
        try:
            setup = cls(**json.loads(text))
            if not isinstance(setup.num_homes, int) or setup.num_homes < 1:
                raise ValueError(f"num_homes must be a positive integer, got {setup.num_homes!r}")
            if "name" not in setup.dataset or "scheme" not in setup.partition or "name" not in setup.model:
                raise ValueError("dataset and model need a name, partition a scheme")
            check_device_spec(setup.device, "simulation.device")
            check_batch_homes(setup.batch_homes)
            return setup
        except (TypeError, ValueError, AttributeError) as err:
            raise UserError(f"malformed home setup {text!r}: {err}") from err


#: ``batch_homes``: ``on`` trains the homes of a dispatch together wherever the model allows it, ``off`` never,
#: ``auto`` where they train on an accelerator (on a CPU one home at a time is faster: docs/sim_speed.md).
BATCH_HOMES = ("auto", "on", "off")


def check_batch_homes(value: object) -> str:
    """``value`` when it is one of :data:`BATCH_HOMES`, else a UserError naming them."""
    if value not in BATCH_HOMES:
        raise UserError(f"simulation.batch_homes must be one of {', '.join(BATCH_HOMES)}, got {value!r}")
    return str(value)


#: Keys of the ``pipeline_home`` config section.
KEYS = ("homes", "pool", "planner", "granularity", "emulate", "timeout_s", "fault_tolerance")
EMULATION_MODES = ("auto", "cgroup", "sleep", "none")  # ecofl.pipeline.runtime.emulation.Emulation, and auto
#: A home's pool when neither the section nor a pipeline latency model names one.
DEFAULT_POOL = "ecofl-3stage"


@dataclass(frozen=True)
class PipelineHomeSettings:
    """Which homes train through the runtime, and how (the ``pipeline_home`` section).

    ``homes``: partition ids, or ``"all"``; empty: no home (the default).
    ``pool``: a pool (:func:`ecofl.pools.load_pool`'s names) for every selected
    home, or a list (home h takes entry h mod its length); None: the home's
    pool in the pipeline latency model at the round's virtual time, else
    :data:`DEFAULT_POOL`. ``planner`` and ``granularity``: None takes the
    pipeline latency model's (else ``ecofl`` and ``block``). ``emulate``:
    ``cgroup`` (each device confined to its cores and memory), ``sleep``
    (devices sleep to the cost model), ``none`` (host speed) or ``auto``
    (cgroup where cgroups are writable, else sleep; the default); ``true``
    and ``false`` are the old spellings of sleep and none. ``timeout_s``:
    the runtime's bound on any step. ``fault_tolerance``: heartbeats,
    replication and re-planning, so a home whose device fails or slows down
    still answers the round (``ecofl.pipeline.runtime.faults``).
    """

    homes: tuple[int, ...] | str = ()
    pool: str | tuple[str, ...] | None = None
    planner: str | None = None
    granularity: str | None = None
    emulate: str = "auto"
    timeout_s: float = 120.0
    fault_tolerance: bool = True

    @classmethod
    def from_dict(cls, values: Mapping) -> PipelineHomeSettings:
        """Parse the section (Hydra, the run config or the setup's JSON); a bad value is a UserError."""
        unknown = sorted(set(values) - set(KEYS))
        if unknown:
            raise UserError(f"unknown pipeline_home setting(s) {', '.join(unknown)}; valid: {', '.join(KEYS)}")
        values = {k: v for k, v in values.items() if v is not None and v != ""}
        homes = values.get("homes", ())
        if isinstance(homes, str) and homes != "all":  # the run config (TOML) may say "0,1"
            homes = [h for h in homes.replace(" ", "").split(",") if h]
        if homes != "all":
            try:
                homes = tuple(sorted({int(h) for h in homes}))
            except (TypeError, ValueError):
                raise UserError(f"pipeline_home.homes must be partition ids or 'all', got {homes!r}") from None
        pool = values.get("pool")
        if pool is not None:
            names = [pool] if isinstance(pool, str) else list(pool)
            if not names:
                raise UserError("pipeline_home.pool is an empty list; give a pool name or leave it out")
            for name in names:
                load_pool(name)  # an unknown pool is a UserError naming the valid ones
            pool = names[0] if isinstance(pool, str) else tuple(names)
        planner = values.get("planner")
        if planner is not None:
            check_planner(planner)
        emulate = values.get("emulate", "auto")
        timeout_s = values.get("timeout_s", 120.0)
        tolerant = values.get("fault_tolerance", True)
        if emulate not in EMULATION_MODES:
            raise UserError(f"pipeline_home.emulate must be one of {', '.join(EMULATION_MODES)}, got {emulate!r}")
        if not isinstance(tolerant, bool) or isinstance(timeout_s, bool) \
                or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise UserError("pipeline_home.fault_tolerance must be a boolean and timeout_s positive: "
                            f"{dict(values)}")
        return cls(homes, pool, planner, values.get("granularity"), emulate, float(timeout_s), tolerant)

    def to_dict(self) -> dict:
        """The setup's JSON form: empty when no home is selected (nothing changes for other runs)."""
        if not self.homes:
            return {}
        data = asdict(self)
        data["homes"] = self.homes if self.homes == "all" else list(self.homes)
        data["pool"] = list(self.pool) if isinstance(self.pool, tuple) else self.pool
        return data

    def selects(self, home: int) -> bool:
        return self.homes == "all" or home in self.homes

    def planning(self, latency: Mapping) -> tuple[str, str]:
        """(planner, granularity): this section's, else the pipeline latency model's, else ecofl and block."""
        pipeline = latency if latency.get("kind") == "pipeline" else {}
        return (self.planner or pipeline.get("planner") or "ecofl",
                self.granularity or pipeline.get("granularity") or "block")

    def pool_name(self, home: int, latency_model: object, virtual_time: float) -> str:
        """Home ``home``'s pool at ``virtual_time`` (see the class docstring)."""
        if isinstance(self.pool, str):
            return self.pool
        if self.pool:
            return self.pool[home % len(self.pool)]
        if isinstance(latency_model, PipelineLatency):
            return latency_model.state(home, virtual_time)[0]
        return DEFAULT_POOL


def pipeline_home_dict(section: Mapping | None) -> dict:
    """The ``pipeline_home`` config section as the setup carries it ({} when off)."""
    return PipelineHomeSettings.from_dict(dict(section or {})).to_dict()
