"""The message contract between the Eco-FL ServerApp and a home's ClientApp, as Flower records.

``server/`` and ``client/`` both import this package and not each other
(Flower's examples share ``task.py`` the same way), so the record names and
their encoding live in one place. The contract's plain data (what a task,
a reply and a report carry; the federation setup) is Flower-free and lives in
``ecofl.fl.transport`` and ``ecofl.fl.federation_setup``; this package only
maps it to and from Flower's ``RecordDict``. The layout follows Flower's own
strategies, so a home also answers ``flwr.serverapp.strategy.FedAvg``:

=========  ==========================================  =============================================
message    content sent to the home                    reply content
=========  ==========================================  =============================================
query      ``config``: setup, virtual_time             ``metrics``: partition-id, latency_s,
                                                       num-examples, label-histogram
train      ``arrays``: global model; ``config``:       ``arrays``: trained model; ``metrics``:
           setup, virtual_time, and the training       partition-id, num-examples, loss, latency_s,
           hyper-parameters (epochs, batch_size, lr,   train_s (pipeline homes: pipeline_train_s,
           mu, seed); batch, batch_homes,              ...); ``worker``: node, device, batched
           batch_seeds when the dispatch may train     (where and how it ran)
           together
evaluate   ``arrays``; ``config``: setup               ``metrics``: num-examples, loss, accuracy
=========  ==========================================  =============================================

A task's routing (group, round, dispatch, version: ``ecofl.fl.transport.Route``)
stays with the task on the server; only the virtual time travels, and, when
``simulation.batch_homes`` allows it, the homes and seeds of the task's
:class:`~ecofl.fl.dispatch_batch.DispatchBatch` (``client.dispatch_batches``).
``setup`` is the JSON of :class:`ecofl.fl.federation_setup.FederationSetup`. A home that cannot
serve a request answers with a Flower ``Error`` (code
:data:`MALFORMED_REQUEST`, or :data:`PIPELINE_FAILED` when its pipeline
runtime failed) whose reason says why, instead of crashing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode

from ecofl.fl.dispatch_batch import DispatchBatch
from ecofl.fl.transport import HomeReport, TrainReply, Weights

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
SETUP = "setup"
PARTITION_ID = "partition-id"
NUM_EXAMPLES = "num-examples"  # the key Flower's strategies weight by
MALFORMED_REQUEST = 400  # Flower's own error codes (flwr.common.constant.ErrorCode) stop at 8
PIPELINE_FAILED = 500  # the home's pipeline runtime could not train (client.pipeline_training)
#: node_config keys of a deployed home (docs/deploy.md): its home service's HOST:PORT and the file with the
#: home's secret. With them the ClientApp trains through the home service instead of in its own process.
HOME_SERVICE = "home-service"
HOME_SECRET_FILE = "home-secret-file"
#: The reply's record naming where the home ran (``node``: the Ray node of a simulated home, else the host;
#: ``device``: what it trained on, e.g. "cpu" or "cuda:0 NVIDIA H200"; ``batched``: trained with its dispatch).
WORKER = "worker"
#: Train-config keys of a task's dispatch batch (:class:`~ecofl.fl.dispatch_batch.DispatchBatch`).
BATCH_ID, BATCH_HOMES, BATCH_SEEDS = "batch", "batch_homes", "batch_seeds"


def config_record(values: Mapping[str, object]) -> ConfigRecord:
    """A ConfigRecord of ``values``; None values are left out (Flower has no null)."""
    return ConfigRecord({key: value for key, value in values.items() if value is not None})


def query_content(setup_json: str, virtual_time: float, train: Mapping[str, object] | None = None) -> RecordDict:
    """The profiling query; ``train`` (the local training settings) lets a home without a latency model
    estimate its round time."""
    values = {**(train or {}), SETUP: setup_json, "virtual_time": float(virtual_time)}
    return RecordDict({CONFIG: config_record(values)})


def train_content(
    weights: Weights, train: Mapping[str, object], virtual_time: float, setup_json: str,
    batch: DispatchBatch | None = None,
) -> RecordDict:
    """A training task: the global model, the hyper-parameters, the virtual time the round was sent at, and
    the dispatch batch it may train with."""
    values = {**train, SETUP: setup_json, "virtual_time": float(virtual_time)}
    if batch is not None:
        values.update({BATCH_ID: batch.id, BATCH_HOMES: list(batch.homes), BATCH_SEEDS: list(batch.seeds)})
    return RecordDict({ARRAYS: ArrayRecord(list(weights)), CONFIG: config_record(values)})


def read_batch(config: ConfigRecord) -> DispatchBatch | None:
    """The dispatch batch a train config names, or None (none named, or malformed: the home trains alone)."""
    if BATCH_ID not in config:
        return None
    try:
        homes = tuple(int(h) for h in config[BATCH_HOMES])
        seeds = tuple(int(s) for s in config[BATCH_SEEDS])
        return DispatchBatch(str(config[BATCH_ID]), homes, seeds)
    except (KeyError, TypeError, ValueError):
        return None


def evaluate_content(weights: Weights, setup_json: str) -> RecordDict:
    return RecordDict({ARRAYS: ArrayRecord(list(weights)), CONFIG: config_record({SETUP: setup_json})})


def report_content(report: HomeReport) -> RecordDict:
    """A home's answer to the query: its latency and label histogram."""
    return RecordDict(
        {
            METRICS: MetricRecord(
                {
                    PARTITION_ID: int(report.home),
                    "latency_s": float(report.latency_s),
                    NUM_EXAMPLES: int(report.num_samples),
                    "label-histogram": [int(c) for c in report.label_histogram],
                }
            )
        }
    )


def reply_content(
    reply: TrainReply, extra_metrics: Mapping[str, int | float] | None = None, worker: Worker | None = None
) -> RecordDict:
    """A home's trained weights and what it measured (``extra_metrics``: e.g. the pipeline's times,
    ``train_s``), and where it ran."""
    metrics = MetricRecord(
        {
            **dict(extra_metrics or {}),
            PARTITION_ID: int(reply.home),
            NUM_EXAMPLES: int(reply.num_samples),
            "loss": float(reply.loss),
            "latency_s": float(reply.latency_s),
        }
    )
    content = RecordDict({ARRAYS: ArrayRecord(list(reply.weights or [])), METRICS: metrics})
    if worker is not None:
        content[WORKER] = ConfigRecord({"node": worker.node, "device": worker.device, "batched": worker.batched})
    return content


@dataclass(frozen=True)
class Worker:
    """Where a home trained: the node, the device (e.g. ``"cpu"``, ``"cuda:0 NVIDIA H200"``), with its dispatch
    or alone; and the training seconds it measured."""

    node: str = "?"
    device: str = "?"
    batched: bool = False
    train_s: float = 0.0


def read_worker(message: Message) -> Worker:
    """The :class:`Worker` a train reply reports; ``"?"``, False and 0 for what it leaves out."""
    record = message.content.config_records.get(WORKER) or ConfigRecord()
    metrics = message.content.metric_records.get(METRICS)
    train_s = metrics.get("train_s", 0.0) if metrics is not None else 0.0
    return Worker(
        node=str(record.get("node", "?")),
        device=str(record.get("device", "?")),
        batched=record.get("batched") is True,
        train_s=float(train_s) if isinstance(train_s, (int, float)) else 0.0,
    )


def read_report(message: Message) -> HomeReport:
    """The :class:`HomeReport` in a query reply (raises KeyError/TypeError when malformed)."""
    metrics = message.content[METRICS]
    return HomeReport(
        home=int(metrics[PARTITION_ID]),
        latency_s=float(metrics["latency_s"]),
        label_histogram=np.asarray(metrics["label-histogram"], dtype=np.int64),
        num_samples=int(metrics[NUM_EXAMPLES]),
    )


#: What kind of failure an error reply's code is (``ecofl.fl.home_failures``): Flower's codes, then ours.
FAILURE_KINDS = {ErrorCode.LOAD_CLIENT_APP_EXCEPTION: "raised", ErrorCode.CLIENT_APP_RAISED_EXCEPTION: "raised",
                 ErrorCode.MESSAGE_UNAVAILABLE: "unavailable", ErrorCode.REPLY_MESSAGE_UNAVAILABLE: "unavailable",
                 ErrorCode.NODE_UNAVAILABLE: "node_unavailable", ErrorCode.CLIENT_APP_CRASHED: "crashed",
                 MALFORMED_REQUEST: "malformed_request", PIPELINE_FAILED: "pipeline_failed"}


def failure_kind(message: Message) -> str:
    """The kind of failure an error reply reports (``"error"`` for a code without one)."""
    return FAILURE_KINDS.get(message.error.code, "error")


def read_reply(message: Message, home: int) -> TrainReply:
    """The :class:`TrainReply` in a train reply; a Flower error becomes ``TrainReply.error`` and its kind."""
    if message.has_error():
        reason = message.error.reason or f"error code {message.error.code}"
        return TrainReply(home=home, weights=None, num_samples=0, loss=float("nan"), latency_s=0.0, error=reason,
                          failure=failure_kind(message))
    try:
        metrics = message.content[METRICS]
        return TrainReply(
            home=home,
            weights=message.content[ARRAYS].to_numpy_ndarrays(),
            num_samples=int(metrics[NUM_EXAMPLES]),
            loss=float(metrics["loss"]),
            latency_s=float(metrics["latency_s"]),
        )
    except (KeyError, TypeError, ValueError) as err:
        return TrainReply(
            home=home, weights=None, num_samples=0, loss=float("nan"), latency_s=0.0,
            error=f"malformed reply: {err!r}", failure="malformed_reply",
        )
