"""One experiment's settings, from Hydra's composed config or Flower's run config.

Hydra (``conf/config.yaml``) and ``flwr run`` (``[tool.flwr.app.config]`` in
``pyproject.toml``, flattened to dotted keys) describe the same nested
settings; :func:`experiment` turns either into the pieces the apps need: the
:class:`~ecofl.fl.federation_setup.FederationSetup` every home receives, the event loop's
:class:`~ecofl.fl.loop_config.LoopConfig` and the server's own settings. Missing
keys take the defaults below (TOML has no null: in the run config an empty
string stands for it); an unknown key is an error naming the valid ones.
A null ``loop.round_deadline`` means ``none`` (wait for every home), not the
default. Flower is imported only to
read its run config, so the in-process simulation runs where Flower is not
installed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from ecofl.accelerator import check_device_spec
from ecofl.data import CONFIG_OPTIONS, load_dataset
from ecofl.errors import UserError
from ecofl.fl.federation_setup import FederationSetup, check_batch_homes, pipeline_home_dict
from ecofl.fl.latency import pipeline_pool_states
from ecofl.fl.loop_config import LoopConfig, loop_config_fields
from ecofl.fl.pipeline_rounds import pipeline_round_times
from ecofl.models import build_model

#: What to do when homes stay silent through the connect phase (``server.grid_transport``).
SILENT_HOMES = ("continue", "stop")
#: The ``strategy`` and ``grouping`` sections' keys, and the LoopConfig field each sets.
STRATEGY_FIELDS = {"name": "strategy", "alpha": "alpha", "staleness": "staleness",
                   "staleness_a": "staleness_a", "staleness_b": "staleness_b"}
GROUPING_FIELDS = {"num_groups": "num_groups", "lambda": "lam", "rt": "rt", "rt_scale": "rt_scale",
                   "latency_units": "latency_units"}
#: Keys of the ``loop`` section: LoopConfig's fields that no other section sets.
LOOP_KEYS = tuple(
    name for name in loop_config_fields()
    if name not in {*STRATEGY_FIELDS.values(), *GROUPING_FIELDS.values(), "train", "seed"}
)
STRATEGY_KEYS = tuple(STRATEGY_FIELDS)
GROUPING_KEYS = tuple(GROUPING_FIELDS)
SERVER_KEYS = ("eval_samples", "connect_timeout_s", "query_timeout_s", "reply_timeout_s", "silent_homes",
               "messages_in_flight", "train_in_background")
SIMULATION_KEYS = ("actors", "cpus_per_actor", "gpus_per_actor", "address", "device", "batch_homes")


@dataclass(frozen=True)
class ServerSettings:
    """What the ServerApp needs besides the loop: evaluation, timeouts, where to write."""

    eval_samples: int | None = None  # test samples for the global accuracy (None: the whole test split)
    connect_timeout_s: float = 300.0  # wait this long for all homes to connect and answer the profiling query
    query_timeout_s: float = 60.0  # a latency query's replies; silent homes are left out
    reply_timeout_s: float = 600.0  # a train round's replies; later ones are stragglers
    silent_homes: str = "continue"  # homes silent through the connect phase: "continue" without them, or "stop"
    messages_in_flight: int = 500  # at most this many messages of one exchange pushed and unanswered
    # virtual clock: the rounds in flight train while the server applies the first to complete
    # (ecofl/fl/foreseen_rounds.py); false: each dispatch waits for its replies before the loop goes on
    # (the same updates, failures included; only slower where rounds could train side by side)
    train_in_background: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.train_in_background, bool):
            raise ValueError(f"server.train_in_background must be true or false, got {self.train_in_background!r}")
        if self.silent_homes not in SILENT_HOMES:
            raise ValueError(f"server.silent_homes must be one of {', '.join(SILENT_HOMES)}, got {self.silent_homes!r}")
        if self.messages_in_flight < 1:
            raise ValueError(f"server.messages_in_flight must be at least 1, got {self.messages_in_flight}")


@dataclass(frozen=True)
class SimulationSettings:
    """Flower's simulation engine: Ray actors that run the homes' ClientApps.

    Without ``address`` the engine starts a private Ray instance on this
    machine sized for ``actors`` actors. With ``address`` (``HOST:PORT`` of
    a running cluster's head, as ``ray start --head`` prints it) it joins
    that cluster instead, and Flower starts as many actors as the cluster's
    nodes have room for (``actors`` is then not used). Each actor takes
    ``cpus_per_actor`` CPUs and ``gpus_per_actor`` GPUs of its node.

    ``device`` is where homes train (:mod:`ecofl.accelerator`: ``auto``,
    ``cpu``, ``cuda``, ``cuda:N``) and ``batch_homes`` whether a dispatch's
    homes train as one computation (``auto``: on an accelerator; ``on``;
    ``off``). :meth:`actor_layout` turns them into the actors' resources.
    """

    actors: int = 2  # homes training at the same time on a private instance (one per actor)
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    address: str | None = None  # a running Ray cluster to join (HOST:PORT); None: a private instance
    device: str = "auto"
    batch_homes: str = "auto"

    def __post_init__(self) -> None:
        if self.actors < 1 or not self.cpus_per_actor > 0 or self.gpus_per_actor < 0:
            raise ValueError(f"simulation needs actors >= 1, cpus_per_actor > 0 and gpus_per_actor >= 0: {self}")
        object.__setattr__(self, "batch_homes", _on_off(self.batch_homes))
        check_device_spec(self.device, "simulation.device")
        check_batch_homes(self.batch_homes)

    def actor_layout(self, gpus: int) -> SimulationSettings:
        """These settings for a machine whose homes train on ``gpus`` GPUs (0: on the CPU), on a private instance.

        * Homes batched (``batch_homes`` on, or auto on GPUs): one actor per
          GPU, or one actor on the CPU, with every CPU of the actors it
          replaces; it trains each dispatch's homes together
          (``client/dispatch_batches.py``).
        * Homes on GPUs, one at a time, ``gpus_per_actor`` left at 0: the
          actors share the GPUs (``gpus / actors`` each).
        * Otherwise unchanged. A joined cluster (``address``) is never changed.
        """
        if self.address:
            return self
        cpus = self.actors * self.cpus_per_actor
        if self.batch_homes == "on" or (self.batch_homes == "auto" and gpus):
            actors = max(1, gpus)
            return replace(self, actors=actors, cpus_per_actor=cpus / actors, gpus_per_actor=1.0 if gpus else 0.0)
        if gpus and self.gpus_per_actor == 0:
            return replace(self, gpus_per_actor=gpus / self.actors)
        return self

    def backend_config(self) -> dict:
        """``run_simulation``'s backend config: the actors' resources and ``ray.init``'s arguments.

        A private instance is started with ``address="local"``, so a cluster
        someone started on this machine with ``ray start`` is never joined by
        accident (``ray.init`` would join it otherwise).
        """
        resources = {"num_cpus": self.cpus_per_actor, "num_gpus": self.gpus_per_actor}
        if self.address:
            return {"client_resources": resources, "init_args": {"address": self.address}}
        return {
            "client_resources": resources,
            "init_args": {
                "address": "local",
                "num_cpus": max(1, round(self.actors * self.cpus_per_actor)),
                "num_gpus": math.ceil(self.actors * self.gpus_per_actor - 1e-9),
                "include_dashboard": False,
            },
        }


def _on_off(value: object) -> object:
    """YAML 1.1 and TOML booleans as the words ``on`` and ``off`` (``batch_homes: on`` may arrive as True)."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


@dataclass(frozen=True)
class Experiment:
    setup: FederationSetup
    loop: LoopConfig
    server: ServerSettings
    simulation: SimulationSettings
    out_dir: str | None = None
    resume: str | None = None

    def to_json(self) -> str:
        """The whole experiment as JSON (what ``simulations.run`` hands the ServerApp it submits)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Experiment:
        data = json.loads(text)
        return cls(FederationSetup.from_json(json.dumps(data["setup"])), LoopConfig(**data["loop"]),
                   ServerSettings(**data["server"]), SimulationSettings(**data["simulation"]), data["out_dir"],
                   data["resume"])


def experiment(cfg: Mapping) -> Experiment:
    """Build an :class:`Experiment` from the nested settings (Hydra's config as a plain dict)."""
    cfg = dict(cfg)
    homes = int(cfg.get("homes", 300))
    seed = int(cfg.get("seed", 0))
    strategy = _section(cfg, "strategy", STRATEGY_KEYS)
    grouping = _section(cfg, "grouping", GROUPING_KEYS)
    loop = _section(cfg, "loop", LOOP_KEYS)
    if "round_deadline" in dict(cfg.get("loop") or {}) and dict(cfg["loop"])["round_deadline"] in (None, ""):
        loop["round_deadline"] = "none"  # null (Hydra) or "" (the run config): wait for every home
    simulation_section = _section(cfg, "simulation", SIMULATION_KEYS)
    latency = dict(cfg.get("latency") or {})
    if latency:
        latency.update(num_homes=homes, seed=seed)
    model = dict(cfg.get("model") or {"name": "cnn"})
    setup = FederationSetup(
        num_homes=homes,
        dataset=dict(cfg.get("dataset") or {"name": "fashion_mnist"}),
        partition={k: v for k, v in dict(cfg.get("partition") or {"scheme": "shards", "classes_per_client": 2}).items()
                   if v is not None},
        model={"name": model["name"], "options": dict(model.get("options") or {})},
        latency=latency,
        seed=seed,
        pipeline_home=pipeline_home_dict(cfg.get("pipeline_home")),
        device=str(simulation_section.get("device", "auto")),
        batch_homes=str(_on_off(simulation_section.get("batch_homes", "auto"))),
    )
    if not latency and setup.batch_homes == "auto":  # the wall clock: each home's own training time is measured
        setup = replace(setup, batch_homes="off")
        simulation_section["batch_homes"] = "off"
    loop_values = {
        **{STRATEGY_FIELDS[k]: v for k, v in strategy.items()},
        **{GROUPING_FIELDS[k]: v for k, v in grouping.items()},
        **loop,
        "train": dict(cfg.get("train") or {}),
        "seed": seed,
    }
    try:
        loop_config = LoopConfig(**loop_values)
        server = ServerSettings(**_section(cfg, "server", SERVER_KEYS))
        simulation = SimulationSettings(**simulation_section)
    except UserError:
        raise
    except (TypeError, ValueError) as err:
        raise UserError(f"invalid experiment settings: {err}") from err
    if simulation.batch_homes == "on" and not latency:
        raise UserError("simulation.batch_homes=on needs a latency model (the virtual clock): without one a home's "
                        "measured training time is its latency; use batch_homes=auto or off with latency=measured")
    return Experiment(setup, loop_config, server, simulation, cfg.get("out_dir"), cfg.get("resume"))


def experiment_from_run_config(run_config: Mapping) -> Experiment:
    """Flower's flat run config (``train.lr = 0.05`` ...) as an :class:`Experiment`; ``""`` is null."""
    from flwr.common.config import unflatten_dict  # this module is Flower-free otherwise (server/evaluation.py)

    return experiment(unflatten_dict({k: (None if v == "" else v) for k, v in run_config.items()}))


def _section(cfg: Mapping, name: str, keys: tuple[str, ...]) -> dict:
    section = dict(cfg.get(name) or {})
    unknown = sorted(set(section) - set(keys))
    if unknown:
        raise UserError(f"unknown {name} setting(s) {', '.join(unknown)}; valid: {', '.join(keys)}")
    return {k: v for k, v in section.items() if v is not None}



def with_pipeline_rounds(exp: Experiment) -> Experiment:
    """Fill in the pipeline latency model's data, computed once by the server for every home.

    For ``latency.kind = pipeline`` without ``round_s``: each pool's sync-round
    seconds from the pipeline planner and cost model
    (:func:`ecofl.fl.pipeline_rounds.pipeline_round_times`, ``planner`` and
    ``granularity`` from the latency config), ``local_steps`` = epochs x
    mini-batches of a home with the mean partition size, and ``model_bytes``
    of the model's float32 state. Other experiments come back unchanged.
    """
    latency = dict(exp.setup.latency)
    if latency.get("kind") != "pipeline" or "round_s" in latency:
        return exp
    dataset = load_dataset(**exp.setup.dataset, options=CONFIG_OPTIONS)
    model = exp.setup.model
    train = exp.loop.train
    batch_size = int(train.get("batch_size", 10))
    network = build_model(model["name"], dataset.input_shape, dataset.num_classes, **model.get("options", {}))
    latency["round_s"] = pipeline_round_times(
        pipeline_pool_states(latency), model["name"], dataset.input_shape, dataset.num_classes, batch_size,
        planner=latency.get("planner", "ecofl"), granularity=latency.get("granularity", "block"),
    )
    samples = len(dataset.train) / exp.setup.num_homes
    latency.setdefault("local_steps", int(train.get("epochs", 1)) * math.ceil(samples / batch_size))
    latency.setdefault("model_bytes", sum(t.numel() * 4 for t in network.state_dict().values()))
    return replace(exp, setup=replace(exp.setup, latency=latency))
