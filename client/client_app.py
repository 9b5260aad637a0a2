"""Flower ClientApp: a home's portal node (Eco-FL §5).

``query`` reports the home's response latency and label histogram (the
profiling step of §5.2): its latency model's, or without one (the wall
clock) an estimate timed on the home's data (:func:`probe_round_s`); ``train`` trains the home's partition from the
received global model with FedProx's proximal term (§5.1) and returns the
weights, sample count, loss and the home's latency; ``evaluate`` scores the
received model on the home's data.

By default the home trains its model in this one process: a synchronous
pipeline computes the same update (docs/architecture.md), and in simulation the time the
home's device pool would need comes from its latency model at the virtual time
the server sends. Homes selected by the setup's ``pipeline_home`` section
train through the real pipeline runtime instead (:mod:`client.pipeline_training`:
one worker process per device, emulated by default), with the same update;
their reply carries the measured pipeline times (``pipeline_train_s``, ...)
(a deployed home whose node_config names a ``home-service`` trains there,
on the devices joined right now: :mod:`ecofl.deploy`)
and, when the loop runs on the wall clock (no latency model), the measured
training time as ``latency_s``. Which home this node is comes from
``node_config["partition-id"]`` (set by the simulation engine, or by
``flower-supernode --node-config``).

A request this home cannot serve (a malformed setup or training config,
weights of the wrong shape, an unknown home) gets an error reply naming the
problem, and so does a pipeline that fails (a plan that does not fit, a
worker that dies; its workers are stopped first); the node keeps serving.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from dataclasses import fields, replace
from functools import lru_cache

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

import protocol
from client.dispatch_batches import DispatchBatches
from client.federation import Federation, federation
from client.pipeline_training import train_through_pipeline
from ecofl.allocator import keep_freed_memory
from ecofl.deploy.home_client import train_at_home
from ecofl.deploy.secrets import read_secret
from ecofl.errors import UserError
from ecofl.fl.federation_setup import PipelineHomeSettings
from ecofl.fl.transport import HomeReport, TrainReply
from ecofl.net.schema import MalformedMessage, checked
from ecofl.pipeline.runtime import ZooModel
from ecofl.train import TrainConfig, evaluate, train_local
from ecofl.weights import get_weights, set_weights

app = ClientApp()
BATCHES = DispatchBatches()  # this process's dispatch batches (client/dispatch_batches.py)


class MalformedRequest(Exception):
    """The request cannot be served; the reason goes back to the server."""


@app.query()
def query(message: Message, context: Context) -> Message:
    """Report this home's latency and label histogram."""
    try:
        fed, home = _home(message, context)
        virtual_time = _number(message.content[protocol.CONFIG], "virtual_time", 0.0)
        config = train_config(message.content[protocol.CONFIG])
    except MalformedRequest as err:
        return _error(message, err)
    data = fed.home(home)
    latency = fed.latency(home, virtual_time)
    if latency is None:
        try:
            latency = probe_round_s(fed, home, config)
        except UserError as err:  # simulation.device names a device this process lacks
            return _error(message, err)
    report = HomeReport(
        home=home,
        latency_s=latency,
        label_histogram=data.label_histogram,
        num_samples=len(data.y),
    )
    return Message(protocol.report_content(report), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    """Train this home's partition from the received weights (FedProx, reference = received)."""
    keep_freed_memory()  # as the pipeline's workers do: a step's freed tensors are reused, not faulted in again
    try:
        fed, home = _home(message, context)
        config_record = message.content[protocol.CONFIG]
        config = train_config(config_record)
        virtual_time = _number(config_record, "virtual_time", 0.0)
        model = fed.new_model()
        set_weights(model, message.content[protocol.ARRAYS].to_numpy_ndarrays())
        pipeline = PipelineHomeSettings.from_dict(fed.setup.pipeline_home)
    except (MalformedRequest, UserError, ValueError, KeyError, TypeError) as err:
        return _error(message, err)
    if protocol.HOME_SERVICE in context.node_config:
        return _train_at_home_service(message, context, fed, home, get_weights(model), config, virtual_time)
    if pipeline.selects(home):
        return _train_through_pipeline(message, fed, home, pipeline, get_weights(model), config, virtual_time)
    try:
        update = BATCHES.train(fed, home, get_weights(model), config, protocol.read_batch(config_record))
    except UserError as err:  # this process cannot train here (simulation.device names a device it lacks)
        return _error(message, err)
    latency = fed.latency(home, virtual_time)
    reply = TrainReply(
        home=home,
        weights=update.weights,
        num_samples=update.result.num_samples,
        loss=update.result.loss,
        latency_s=update.seconds if latency is None else latency,
    )
    worker = protocol.Worker(worker_node(), fed.device_label, update.batched)
    return Message(protocol.reply_content(reply, {"train_s": update.seconds}, worker), reply_to=message)


def _train_at_home_service(
    message: Message, context: Context, fed: Federation, home: int, weights: list, config: TrainConfig,
    virtual_time: float,
) -> Message:
    """A deployed home: its home service trains on the devices present (docs/deploy.md); a failure is an error reply."""
    data, setup = fed.home(home), fed.setup
    planner, granularity = PipelineHomeSettings.from_dict(setup.pipeline_home).planning(setup.latency)
    model = ZooModel(setup.model["name"], tuple(fed.dataset.input_shape), fed.dataset.num_classes, granularity,
                     dict(setup.model.get("options") or {}))
    try:
        host, _, port = str(context.node_config[protocol.HOME_SERVICE]).rpartition(":")
        secret = read_secret(str(context.node_config.get(protocol.HOME_SECRET_FILE) or "") or None)
        trained = train_at_home((host, int(port)), secret, model, weights, data.x, data.y, config)
    except Exception as err:  # noqa: BLE001 - this round's answer, not the node's end
        reason = f"home {home}'s service: {type(err).__name__}: {err}"
        return Message(Error(code=protocol.PIPELINE_FAILED, reason=reason), reply_to=message)
    latency = fed.latency(home, virtual_time)
    measured = float(trained.metrics.get("pipeline_train_s", 0.0)) + float(trained.metrics.get("pipeline_start_s", 0.0))
    reply = TrainReply(home=home, weights=trained.weights, num_samples=trained.num_samples, loss=trained.loss,
                       latency_s=measured if latency is None else latency)
    metrics = {k: v for k, v in trained.metrics.items() if isinstance(v, (int, float))}
    metrics["home_devices"] = len(trained.devices)
    metrics["train_s"] = measured
    worker = protocol.Worker(worker_node(), "home service")  # on the devices of a deployed home
    return Message(protocol.reply_content(reply, metrics, worker), reply_to=message)


def _train_through_pipeline(
    message: Message, fed: Federation, home: int, settings: PipelineHomeSettings, weights: list,
    config: TrainConfig, virtual_time: float,
) -> Message:
    """The train handler of a home in pipeline mode; any failure is an error reply."""
    data = fed.home(home)
    setup = fed.setup
    planner, granularity = settings.planning(setup.latency)
    model = ZooModel(setup.model["name"], tuple(fed.dataset.input_shape), fed.dataset.num_classes, granularity,
                     dict(setup.model.get("options") or {}))
    try:
        pool = settings.pool_name(home, fed.latency_model, virtual_time)
        trained = train_through_pipeline(settings, pool, model, weights, data.x, data.y, config, planner)
    except Exception as err:  # noqa: BLE001 - a pipeline failure is this round's answer, not the node's end
        reason = f"pipeline home {home}: {type(err).__name__}: {err}"
        return Message(Error(code=protocol.PIPELINE_FAILED, reason=reason), reply_to=message)
    latency = fed.latency(home, virtual_time)
    reply = TrainReply(
        home=home,
        weights=trained.weights,
        num_samples=trained.num_samples,
        loss=trained.loss,
        latency_s=trained.train_s if latency is None else latency,
    )
    metrics = {**trained.metrics(), "train_s": trained.train_s}
    worker = protocol.Worker(worker_node(), "cpu")  # the pipeline runtime's workers train on CPU threads
    return Message(protocol.reply_content(reply, metrics, worker), reply_to=message)


@lru_cache(maxsize=1)
def worker_node() -> str:
    """Where this ClientApp runs: the Ray node of a simulated home (Flower's Ray actors), else the host name."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return str(ray.get_runtime_context().get_node_id())
    return socket.gethostname()


def probe_round_s(fed: Federation, home: int, config: TrainConfig, probe_batches: int = 2) -> float:
    """Estimated seconds of one local training round (``config.epochs`` over the home's data).

    Times ``probe_batches`` training steps after one untimed warm-up step and
    scales to the round's steps. The server groups homes by it until their
    first replies bring the response times it measured itself.
    """
    data = fed.home(home)
    batch = config.batch_size
    probe = replace(config, epochs=1)
    model = fed.new_model().to(fed.device)
    train_local(model, data.x[:batch], data.y[:batch], probe)  # warm-up
    samples = min(len(data.y), probe_batches * batch)
    started = time.perf_counter()
    train_local(model, data.x[:samples], data.y[:samples], probe)  # its loss read at the end: the device is done
    per_step = (time.perf_counter() - started) / max(1, math.ceil(samples / batch))
    return per_step * config.epochs * math.ceil(len(data.y) / batch)


@app.evaluate()
def evaluate_home(message: Message, context: Context) -> Message:
    """Loss and accuracy of the received weights on this home's data."""
    try:
        fed, home = _home(message, context)
        model = fed.new_model()
        set_weights(model, message.content[protocol.ARRAYS].to_numpy_ndarrays())
        model.to(fed.device)
    except (MalformedRequest, UserError, ValueError, KeyError, TypeError) as err:
        return _error(message, err)
    data = fed.home(home)
    result = evaluate(model, data.x, data.y)
    metrics = {protocol.NUM_EXAMPLES: result.num_samples, "loss": result.loss, "accuracy": result.accuracy}
    return Message(RecordDict({protocol.METRICS: MetricRecord(metrics)}), reply_to=message)


def train_config(record: ConfigRecord) -> TrainConfig:
    """The :class:`TrainConfig` in ``record``, its fields checked by the schema that checks every message
    (:func:`ecofl.net.schema.checked`); other fields ignored, missing ones TrainConfig's defaults. A value of the
    wrong type, a non-finite number or an out-of-range value is a :class:`MalformedRequest`."""
    known = {spec.name for spec in fields(TrainConfig)}
    try:
        return checked({key: record[key] for key in known if key in record}, TrainConfig, "train config")
    except MalformedMessage as err:
        raise MalformedRequest(str(err)) from err


def _number(record: ConfigRecord, key: str, default: float) -> float:
    value = record.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise MalformedRequest(f"config {key} must be a finite number, got {value!r}")
    return float(value)


def _home(message: Message, context: Context) -> tuple[Federation, int]:
    """The federation named by the message's setup, and which home this node is."""
    try:
        setup_json = message.content[protocol.CONFIG][protocol.SETUP]
        fed = federation(setup_json)
        home = int(context.node_config[protocol.PARTITION_ID])
    except (KeyError, TypeError) as err:
        raise MalformedRequest(f"request lacks the home setup or this node its partition-id: {err!r}") from err
    except UserError as err:
        raise MalformedRequest(str(err)) from err
    if not 0 <= home < fed.setup.num_homes:
        raise MalformedRequest(f"partition-id {home} is not one of the setup's {fed.setup.num_homes} homes")
    return fed, home


def _error(message: Message, err: Exception) -> Message:
    return Message(Error(code=protocol.MALFORMED_REQUEST, reason=f"{type(err).__name__}: {err}"), reply_to=message)
