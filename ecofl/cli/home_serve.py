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
from ecofl.pipeline.planners import PLANNERS, check_planner
from ecofl.pipeline.runtime.emulation import Emulation


def register(commands: argparse._SubParsersAction) -> None:
    """``ecofl home serve``."""
    parser = commands.add_parser("serve", help="the home service: registry of the devices, trains for the ClientApp")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="address for device daemons and the ClientApp (default: loopback, a free port)")
    parser.add_argument("--secret-file", default=None,
                        help="the home's secret (hex); default $ECOFL_HOME_SECRET_FILE or $ECOFL_HOME_SECRET")
    parser.add_argument("--name", default="home")
    parser.add_argument("--portal-preset", default=None, help="emulate this preset as the portal device")
    parser.add_argument("--planner", default="ecofl", help=f"one of {', '.join(PLANNERS)}")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--emulate", choices=[str(mode) for mode in Emulation], default="sleep",
                       help="sleep: devices that claim a preset sleep to the cost model; cgroup: the devices are "
                            "confined (the portal's stage here, each daemon by whoever started it) and measured "
                            "for real, links paced; none: real devices (no dilation, budgets or pacing)")
    modes.add_argument("--no-emulation", dest="emulate", action="store_const", const=str(Emulation.NONE),
                       help="the same as --emulate none")
    parser.add_argument("--kernel-links", action="store_true",
                        help="emulated devices whose links the kernel shapes (namespaces + tc): "
                             "no pacing in the pipeline")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a device may take to join or answer")
    parser.add_argument("--port-file", default=None, help="write the port listened on to this file once ready")
    parser.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
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
                     planner=args.planner, timeout_s=args.timeout, pace_links=not args.kernel_links) as service:
        print(f"home service {args.name} listening on {service.host}:{service.port}", flush=True)
        if args.port_file:
            with open(args.port_file, "w") as f:
                f.write(f"{service.port}\n")
        stop.wait()
    return 0
