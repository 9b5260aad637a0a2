"""A device's worker process: join the home, then run its stage for every sync-round.

``python -m ecofl.pipeline.runtime.worker --portal HOST:PORT --device D`` with
the home's secret in ``ECOFL_HOME_SECRET`` (hex). The worker proves the secret
to the portal (:mod:`ecofl.pipeline.runtime.auth`) before it learns anything,
receives its :class:`~ecofl.pipeline.runtime.topology.WorkerRole` and the model
spec as JSON, joins the torch.distributed (gloo) group, and serves the
portal's requests on the control channel::

    setup   stage weights (+ FedProx reference), optimizer settings  -> ok
    round   stage 0: inputs [M, share, ...]; last stage: labels      -> done + measurements
    collect                                                          -> weights (first replica of a stage)
    stop                                                             -> (exits)

Any error is reported to the portal as ``{"type": "error"}`` and ends the
process; so does the loss of the portal's connection.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ecofl.pipeline.runtime.auth import join_home
from ecofl.pipeline.runtime.launch import SECRET_ENV, die_with_portal
from ecofl.pipeline.runtime.model_spec import layer_state_keys, spec_from_json, stage_module
from ecofl.pipeline.runtime.stage import Optimization, StageExecutor
from ecofl.pipeline.runtime.topology import WorkerRole
from ecofl.pipeline.runtime.wire import ChannelClosed, recv_message, send_message

def connect(portal: tuple[str, int], timeout_s: float) -> socket.socket:
    """Connect to the portal, retrying until ``timeout_s`` (it may still be starting)."""
    deadline = time.time() + timeout_s
    while True:
        try:
            sock = socket.create_connection(portal, timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.2)


class Worker:
    """The state of one joined worker: its role, stage module and executor."""

    def __init__(self, sock: socket.socket, config: dict[str, Any]):
        self.sock = sock
        self.role = WorkerRole.from_json(config["role"])
        self.timeout_s = float(config["timeout_s"])
        torch.set_num_threads(int(config.get("threads", 1)))
        host, port = config["store"]
        store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=self.timeout_s))
        dist.init_process_group("gloo", store=store, rank=self.role.rank, world_size=self.role.world_size,
                                timeout=timedelta(seconds=self.timeout_s))
        group = None
        for ranks in self.role.groups:  # every rank creates every group, in the same order
            created = dist.new_group(list(ranks))
            if self.role.rank in ranks:
                group = created
        model, layers = spec_from_json(config["model"]).build()
        first, last = self.role.layers
        keys = layer_state_keys(model, layers)
        state = model.state_dict(keep_vars=True)
        self.state = {key: state[key] for layer_keys in keys[first : last + 1] for key in layer_keys}
        module = stage_module(layers, first, last)
        self.parameter_keys = [key for key, t in self.state.items() if isinstance(t, torch.nn.Parameter)]
        self.executor = StageExecutor(self.role, module, group, self.timeout_s)
        if [id(p) for p in self.executor.params] != [id(self.state[k]) for k in self.parameter_keys]:
            raise RuntimeError("stage parameters are not in state_dict order")

    def serve(self) -> None:
        while True:
            header, arrays = recv_message(self.sock)
            kind = header.get("type")
            if kind == "setup":
                self._setup(header, arrays)
                send_message(self.sock, {"type": "ok"})
            elif kind == "round":
                self._round(header, arrays)
            elif kind == "collect":
                first_replica = self.role.rank == self.role.replicas[0]
                weights = {k: t.detach().numpy() for k, t in self.state.items()} if first_replica else {}
                send_message(self.sock, {"type": "weights"}, weights)
            elif kind == "stop":
                return
            else:
                raise ValueError(f"unknown request {kind!r}")

    def _setup(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        with torch.no_grad():
            for key, tensor in self.state.items():
                tensor.copy_(torch.from_numpy(arrays[key]))
        settings = Optimization(**header["optimization"])
        reference = [torch.from_numpy(arrays[f"reference/{k}"]) for k in self.parameter_keys] if settings.mu else []
        self.executor.configure(settings, reference)

    def _round(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        inputs = torch.from_numpy(arrays["inputs"]) if "inputs" in arrays else None
        labels = torch.from_numpy(arrays["labels"]) if "labels" in arrays else None
        stats = self.executor.run_round(inputs, labels, int(header["batch_size"]))
        send_message(self.sock, {
            "type": "done",
            "events": stats.events,
            "loss_sum": stats.loss_sum,
            "peak_resident": stats.peak_resident,
            "peak_activation_bytes": stats.peak_activation_bytes,
            "fixed_bytes": stats.fixed_bytes,
        })

    def close(self) -> None:
        self.executor.close()
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Join a home pipeline as one device.")
    parser.add_argument("--portal", required=True, help="HOST:PORT of the portal's control channel")
    parser.add_argument("--device", type=int, required=True, help="this device's index in the home pool")
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    die_with_portal()
    secret = bytes.fromhex(os.environ.pop(SECRET_ENV, ""))
    if not secret:
        print(f"worker: set {SECRET_ENV} to the home's secret (hex)", file=sys.stderr)
        return 2
    host, port = args.portal.rsplit(":", 1)
    sock = connect((host, int(port)), args.connect_timeout)
    sock.settimeout(args.connect_timeout)
    join_home(sock, secret, args.device)
    config, _ = recv_message(sock)
    sock.settimeout(None)
    try:
        worker = Worker(sock, config)
        send_message(sock, {"type": "ready"})
        worker.serve()
    except ChannelClosed:
        os._exit(1)  # the portal is gone: nobody to report to; threads may be blocked in gloo
    except BaseException as error:  # noqa: BLE001 - reported to the portal, then the process ends
        try:
            send_message(sock, {"type": "error", "kind": type(error).__name__, "message": str(error),
                                "device": args.device, "time": time.time()})
        finally:
            os._exit(1)
    worker.close()
    sock.close()
    # Interpreter teardown with gloo's threads alive can take seconds (or hang); nothing is left to do.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
