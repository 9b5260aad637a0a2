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
              f"{device['memory_bytes'] / 2**30:.1f} GiB, trains on {device.get('accelerator', 'cpu')}")
    if report["round_log"]:
        print(_last_round(report["round_log"][-1]))
    return 0


def _last_round(logged: dict) -> str:
    """The devices the last round was planned on, those left idle, and its sync-round against the prediction."""
    idle = [name for name in logged["devices"] if name not in logged["planned"]]
    line = f"last round: planned on {', '.join(logged['planned'])}" + (f" (idle: {', '.join(idle)})" if idle else "")
    line += f", {logged['pipeline_sync_round_mean_s']:.3g} s a sync-round"
    if "pipeline_predicted_sync_round_s" in logged:
        line += f" ({logged['pipeline_predicted_sync_round_s']:.3g} s predicted)"
    return line
