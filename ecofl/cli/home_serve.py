"""``ecofl home serve``: the home service beside the Flower SuperNode (docs/deploy.md)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from ecofl.cli.address import parse_address
from ecofl.deploy.home_service import HomeService
from ecofl.deploy.secrets import read_secret
from ecofl.devices import MBPS, DeviceSpec, preset
from ecofl.pipeline.planners import check_planner


def run(args: argparse.Namespace) -> int:
    check_planner(args.planner)
    host, port = parse_address(args.listen, allow_any_port=True)
    portal = None
    if args.portal_preset:
        spec = preset(args.portal_preset)
        portal = DeviceSpec("portal", spec.speed, spec.memory_bytes, 100 * MBPS)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s home %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with HomeService(read_secret(args.secret_file), args.name, host, port, portal, emulate=args.emulate,
                     planner=args.planner, timeout_s=args.timeout, pace_links=not args.kernel_links,
                     every_device=args.every_device) as service:
        print(f"home service {args.name} listening on {service.host}:{service.port}", flush=True)
        if args.port_file:
            with open(args.port_file, "w") as f:
                f.write(f"{service.port}\n")
        stop.wait()
    return 0
