"""``ecofl home status``: a running home service's devices and rounds (docs/deploy.md).

Imports neither torch nor the pipeline, so it answers in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json

from ecofl.cli.address import parse_address
from ecofl.deploy.home_status import home_status
from ecofl.deploy.secrets import read_secret
from ecofl.errors import UserError
from ecofl.net.errors import AuthenticationFailed


def register(commands: argparse._SubParsersAction) -> None:
    """``ecofl home status``."""
    status = commands.add_parser("status", help="a running home service's devices and rounds")
    status.add_argument("--home", required=True, metavar="HOST:PORT")
    status.add_argument("--secret-file", default=None,
                        help="the home's secret (hex); default $ECOFL_HOME_SECRET_FILE or $ECOFL_HOME_SECRET")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    address, secret = parse_address(args.home), read_secret(args.secret_file)
    try:
        report = home_status(address, secret)
    except (OSError, AuthenticationFailed, ValueError) as error:  # unreachable, another secret, not a service
        raise UserError(f"no home service at {args.home}: {error}") from None
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"home {report['name']}: {len(report['devices'])} device(s), {report['rounds']} round(s) trained, "
          f"{report['refused']} peer(s) refused")
    for device in report["devices"]:
        print(f"  {device['id']}: {device['name']} speed {device['speed']:.3g}, "
              f"{device['memory_bytes'] / 2**30:.1f} GiB")
    return 0
