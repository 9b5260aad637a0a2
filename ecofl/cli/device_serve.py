"""``ecofl device serve``: run this device's daemon, a member of its home (docs/deploy.md)."""

from __future__ import annotations

import argparse
import logging

from ecofl.accelerator import check_device_spec
from ecofl.cli.address import parse_address
from ecofl.deploy.device_daemon import serve
from ecofl.deploy.secrets import read_secret
from ecofl.errors import UserError


def run(args: argparse.Namespace) -> int:
    if not args.bandwidth > 0:
        raise UserError(f"--bandwidth must be positive, got {args.bandwidth}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s device %(message)s")
    return serve(parse_address(args.home), read_secret(args.secret_file), args.name, args.preset, args.bandwidth,
                 check_device_spec(args.accelerator, "--accelerator"))
