"""``ecofl device serve``: run this device's daemon, a member of its home (docs/deploy.md)."""

from __future__ import annotations

import argparse
import logging
import socket

from ecofl.cli.address import parse_address
from ecofl.deploy.device_daemon import serve
from ecofl.deploy.secrets import read_secret
from ecofl.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl device serve``."""
    parser = subparsers.add_parser("serve", help="join the home service and run pipeline workers until stopped")
    parser.add_argument("--home", required=True, metavar="HOST:PORT", help="the home service's address")
    parser.add_argument("--secret-file", default=None,
                        help="the home's secret (hex); default $ECOFL_HOME_SECRET_FILE or $ECOFL_HOME_SECRET")
    parser.add_argument("--name", default=socket.gethostname(), help="this device's name (default: host name)")
    parser.add_argument("--preset", default=None,
                        help="claim a device preset (emulated: tests and demos) instead of measuring this machine")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="this device's link in Mbps")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.bandwidth > 0:
        raise UserError(f"--bandwidth must be positive, got {args.bandwidth}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s device %(message)s")
    return serve(parse_address(args.home), read_secret(args.secret_file), args.name, args.preset, args.bandwidth)
