"""The shaped home networks of a local deployment (scripts/deploy_local.sh, as root).

``python scripts/deploy_local/home_networks.py HOMES DEVICES MBPS OUT_JSON`` builds, for each
home, a :class:`ecofl.net.netns.HomeNetwork`: one network
namespace per device daemon, its link shaped with ``tc tbf`` at MBPS both
ways, all joined by a bridge to the home's portal address on this machine.
It writes ``OUT_JSON`` (``{"homes": [{"portal": ADDRESS, "namespaces":
[NAME, ...]}, ...]}``), then holds the networks until SIGTERM or SIGINT, or
until the process that started it dies, and removes them on the way out.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
from contextlib import ExitStack
from pathlib import Path

from ecofl.devices import DeviceSpec, HomePool, MBPS
from ecofl.net.netns import HomeNetwork


def main(argv: list[str]) -> int:
    homes, devices, mbps, out = int(argv[0]), int(argv[1]), float(argv[2]), Path(argv[3])
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the script died, clean up
    link = DeviceSpec("device", 1.0, 1 << 30, mbps * MBPS)
    pool = HomePool("deployment", (link,) * (devices + 1))  # device 0: the portal, on this machine's side
    with ExitStack() as networks:
        listing = []
        for _ in range(homes):
            network = networks.enter_context(HomeNetwork(pool, list(range(1, devices + 1))))
            listing.append({"portal": network.portal_address,
                            "namespaces": [network.namespace(d) for d in range(1, devices + 1)]})
        partial = out.with_suffix(".part")
        partial.write_text(json.dumps({"homes": listing}))
        os.replace(partial, out)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
