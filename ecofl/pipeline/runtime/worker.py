"""A device's worker process: join the home, then serve the portal's sessions.

``python -m ecofl.pipeline.runtime.worker --portal HOST:PORT --device D`` with
the home's secret in ``ECOFL_HOME_SECRET`` (hex). The worker proves the secret
to the portal (:mod:`ecofl.net.auth`) before it learns anything,
receives the model spec as JSON on the sealed control channel, opens its data
port (:class:`~ecofl.net.mesh.DataListener`), reports it, and
serves the portal's requests (:class:`~ecofl.pipeline.runtime.worker_requests.Worker`)
until it says stop. Any error is reported as an ``Error`` message and ends
the process; so does the loss of the portal's connection. With
``--sessions`` (a device daemon's warm worker,
:mod:`ecofl.deploy.device_daemon`) the process serves one session after
another, as standard input names them, so no round waits for Python and torch
to start. A portal's own local workers run :func:`main` in a child of its
fork server (:mod:`.worker_forks`) for the same reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from typing import Callable

# torch's optimizers import its compiler (torch._dynamo, with sympy) at their first construction: 1.85 CPU-s
# on this machine's host (2026-12-03), 18 s inside a Nano's 0.1-core quota, which every worker paid as it entered
# its first epoch. Imported here, a daemon pays it once as it starts, and a portal's fork server once for all its
# children (they share its pages), outside any device's quota.
import torch._dynamo  # noqa: F401

from ecofl.allocator import keep_freed_memory
from ecofl.net.schema import encode
from ecofl.net.dial import dial
from ecofl.pipeline.runtime.control_messages import REQUESTS, Config, Error, Ready
from ecofl.net.errors import AuthenticationFailed
from ecofl.net.auth import SECRET_ENV
from ecofl.pipeline.runtime.pipe_messages import SESSION_REQUESTS, SessionFree, read_line, write_line
from ecofl.pipeline.runtime.worker_environment import die_with_portal
from ecofl.net.mesh import DataListener
from ecofl.pipeline.runtime.process_memory import rss_bytes
from ecofl.pipeline.runtime.worker_requests import Worker
from ecofl.net.errors import ChannelClosed
from ecofl.net.wire import recv_message, send_message


def serve_session(portal: tuple[str, int], device: int, secret: bytes, connect_timeout_s: float,
                  stopped: Callable[[], None] = lambda: None, baseline_rss: int | None = None) -> bool:
    """Join ``portal`` as ``device`` and serve it until it says stop (True) or goes away (False).

    ``stopped()`` is called as soon as the portal said stop, before the
    session's threads and sockets are closed. Any other failure is reported
    to the portal, then raised.
    """
    keep_freed_memory()  # a step's freed tensors stay for the next, not faulted in again (ecofl.allocator)
    sock = dial(portal, secret, device, timeout_s=connect_timeout_s, retry_for_s=connect_timeout_s)
    sock.settimeout(None)  # the configuration comes once every device has joined: the portal's deadline rules
    listener: DataListener | None = None
    worker: Worker | None = None
    try:
        header, _ = recv_message(sock)
        config = REQUESTS.decode(header)
        if not isinstance(config, Config):
            raise ValueError(f"expected the configuration, got {config.TYPE!r}")
        listener = DataListener(sock.getsockname()[0], secret)  # on the interface that reaches the portal
        worker = Worker(sock, device, config, secret, listener, baseline_rss)
        send_message(sock, encode(Ready(listener.address)))
        worker.serve()
        stopped()
        return True
    except ChannelClosed:
        return False  # the portal is gone: nobody to report to
    except BaseException as error:
        traceback.print_exc()  # the device's own log (the daemon's, or the portal's for a local worker)
        try:
            send_message(sock, encode(Error(type(error).__name__, str(error), device, time.time())))
        except OSError:
            pass
        raise
    finally:
        if worker is not None:
            worker.close()
        if listener is not None:
            listener.close()
        sock.close()


def serve_sessions(secret: bytes, connect_timeout_s: float, baseline_rss: int | None) -> int:
    """A warm worker (a device daemon's): one session per line of standard input, one after another.

    Each line is a :class:`~.pipe_messages.Session`; the worker says
    :class:`~.pipe_messages.SessionFree` once its imports are done and after
    each session, so the daemon knows when it is free. A session that fails
    ends the process (it may hold broken state; the daemon starts another).
    """
    write_line(sys.stdout, SessionFree())
    for line in sys.stdin:
        session = read_line(line, SESSION_REQUESTS)
        host, port = session.portal
        try:
            # The portal listens before it invites: a refused connection is a session that is over already.
            served = serve_session((host, port), session.device, secret, min(connect_timeout_s, 5.0),
                                   stopped=lambda: write_line(sys.stdout, SessionFree()), baseline_rss=baseline_rss)
        except (OSError, AuthenticationFailed) as error:  # never joined: nothing of the session is held
            print(f"worker: session at {host}:{port} not joined: {error}", file=sys.stderr)
            served = False
        if not served:
            write_line(sys.stdout, SessionFree())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Join a home pipeline as one device.")
    parser.add_argument("--portal", help="HOST:PORT of the portal's control channel")
    parser.add_argument("--device", type=int, help="this device's index in the home pool")
    parser.add_argument("--sessions", action="store_true",
                        help="serve the sessions given on standard input, one after another (a daemon's warm worker)")
    parser.add_argument("--connect-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not args.sessions and (args.portal is None or args.device is None):
        parser.error("--portal and --device are required (or --sessions)")
    die_with_portal()
    secret = bytes.fromhex(os.environ.pop(SECRET_ENV, ""))
    if not secret:
        print(f"worker: set {SECRET_ENV} to the home's secret (hex)", file=sys.stderr)
        return 2
    baseline = rss_bytes()  # Python, torch and this package, before any model
    try:
        if args.sessions:
            code = serve_sessions(secret, args.connect_timeout, baseline)
        else:
            host, port = args.portal.rsplit(":", 1)
            code = 0 if serve_session((host, int(port)), args.device, secret, args.connect_timeout,
                                      baseline_rss=baseline) else 1
    except BaseException:  # noqa: BLE001 - reported to the portal already
        code = 1
    os._exit(code)  # link threads are daemons; nothing is left to do


if __name__ == "__main__":
    sys.exit(main())
