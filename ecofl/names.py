"""The names a user may give on a command line or in a config, as plain tuples importable without torch.

``ecofl --help`` lists them at once (parsing needs no model, dataset or
runtime), and the modules that implement them take their names from here,
or, where they are a table of their own (the model zoo, the planners, the
emulation modes), a test checks that they implement exactly these
(``tests/test_cli.py``).
"""

from __future__ import annotations

#: :func:`ecofl.data.load_dataset`'s datasets.
DATASETS: tuple[str, ...] = ("digits", "fashion_mnist", "mnist", "cifar10")
#: :func:`ecofl.data.partition`'s schemes (Eco-FL §6.1).
PARTITION_SCHEMES: tuple[str, ...] = ("iid", "shards", "dirichlet", "rlg-iid", "rlg-niid")
#: The model zoo (:func:`ecofl.models.build_model`), in registration order.
MODELS: tuple[str, ...] = (
    "cnn", "mobilenet_v2", *(f"efficientnet_b{i}" for i in range(8)), "resnet18", "resnet50", "bert_small",
)
#: Where a planner may cut a model (:func:`ecofl.models.layer_sequence`).
GRANULARITIES: tuple[str, ...] = ("block", "fine")
#: The pipeline planners (:mod:`ecofl.pipeline.planners`).
PLANNERS: tuple[str, ...] = ("ecofl", "hpp", "pipeedge", "even", "dp")
#: The schedules a home may train with (:class:`ecofl.pipeline.plan.ScheduleKind`).
TRAINING_SCHEDULES: tuple[str, ...] = ("1f1b", "gpipe", "async-1f1b")
#: Re-planning after a device fails (:mod:`ecofl.pipeline.replan`).
REPLAN_KINDS: tuple[str, ...] = ("lightweight", "full", "heavy")
#: Where a stage with two neighbours is backed up (:mod:`ecofl.pipeline.replication`): not on the plan's busiest
#: device (the default), or on both.
BACKUP_RULES: tuple[str, ...] = ("spare-busiest", "both-neighbours")
#: How a home's devices are emulated on one machine (:class:`ecofl.pipeline.runtime.emulation.Emulation`).
EMULATION_MODES: tuple[str, ...] = ("cgroup", "sleep", "none")
#: The phases of a sync-round a worker can be struck in (:mod:`ecofl.pipeline.runtime.traps`).
ROUND_PHASES: tuple[str, ...] = ("forward", "backward", "send", "allreduce", "step")
PHASES: tuple[str, ...] = ROUND_PHASES + ("replicate", "global-copy", "migrate", "recover")
#: ``ecofl home train --inject``'s events (:mod:`ecofl.pipeline.runtime.faults`).
INJECTION_SYNTAX = "kill:D@R[:PHASE[:K]], freeze:D@R[:PHASE[:K]], slow:D*F@R or join:D@R"
