"""A fork server for the workers a portal starts on its own machine.

Starting a worker as a new program costs about two CPU-seconds of Python
and torch imports, more than a sync-round of a small model, and a portal
starts one per local device, again after every failure. So the first
worker a process starts brings up a fork server (:func:`serve`, a Python
process of its own), which imports torch and the worker
once, starts no thread and runs no torch operation, then forks one child
per device. A child is the same worker a real device runs
(:func:`ecofl.pipeline.runtime.worker.main`), from its own arguments and
environment, in its own cgroup and network namespace if it has them, its
output in its own log. The idea is ``multiprocessing``'s ``forkserver``,
without its pickles and its re-import of ``__main__``: requests and replies
are JSON lines on the server's standard input and output, which only the
process that started it holds.

Nothing outlives the portal. A child is killed when the server dies
(``PR_SET_PDEATHSIG``); the server kills its children and exits when its
input closes, which is when the portal exits or dies. The server reaps its
children and reports each exit code (negative: the signal), so a
:class:`ForkedWorker` answers as a :class:`subprocess.Popen` does.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence

from ecofl.pipeline.runtime.pipe_messages import (FORK_REPLIES, FORK_REQUESTS, Exited, Fork, Forked, ForkFailed,
                                                   line_of, read_line, write_line)
from ecofl.pipeline.runtime.worker_environment import die_with

WORKER_NAME = "ecofl-device"  # a child's process name (comm) is this and its device: `ps` tells them apart
START_TIMEOUT_S = 120.0  # the server's imports, on a loaded machine
_PR_SET_NAME, _CLONE_NEWNET = 15, 0x40000000


class ForkedWorker:
    """A worker forked by the server, as :class:`subprocess.Popen` would show it (pid, poll, wait, signals)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._exited = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass  # exited; the server's report is on its way

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exit(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
        self._exited.set()


class WorkerForks:
    """The client side: a running fork server and the workers it has forked for this process."""

    def __init__(self, environment: dict[str, str]):
        command = [sys.executable, "-c", f"from {__name__} import serve; serve()"]
        self.process = subprocess.Popen(command, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lock = threading.Lock()
        self._started: dict[int, ForkedWorker | str] = {}  # request id -> its worker, or why it did not start
        self._workers: dict[int, ForkedWorker] = {}
        self._replied = threading.Condition(self._lock)
        self._gone = False  # the server's output has ended
        self._next_id = 0
        threading.Thread(target=self._read_replies, name="worker-forks", daemon=True).start()

    def fork(self, argv: Sequence[str], env: dict[str, str], log_path: str, name: str,
             cgroup_procs: Sequence[str] = (), namespace: str | None = None) -> ForkedWorker:
        """A worker running ``worker.main(argv)`` with ``env``; raises RuntimeError if the server cannot fork it."""
        with self._lock:
            request_id, self._next_id = self._next_id, self._next_id + 1
            request = Fork(request_id, list(argv), dict(env), log_path, name, list(cgroup_procs), namespace)
            try:
                self.process.stdin.write(line_of(request).encode())
                self.process.stdin.flush()
            except OSError as error:
                raise RuntimeError(f"the worker fork server is gone: {error}") from None
            if not self._replied.wait_for(lambda: request_id in self._started or self._gone, START_TIMEOUT_S):
                raise RuntimeError(f"the worker fork server did not fork {name} within {START_TIMEOUT_S:.0f} s")
            if request_id not in self._started:
                raise RuntimeError(f"the worker fork server exited before it forked {name}")
            started = self._started.pop(request_id)
        if isinstance(started, str):
            raise RuntimeError(f"cannot start {name}: {started}")
        return started

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Close the server's input: it kills the workers still running and exits; reap it."""
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _read_replies(self) -> None:
        for line in self.process.stdout:
            reply = read_line(line, FORK_REPLIES)
            with self._lock:
                if isinstance(reply, Exited):
                    worker = self._workers.pop(reply.pid, None)
                    if worker is not None:
                        worker._exit(reply.code)
                elif isinstance(reply, Forked):
                    self._workers[reply.pid] = self._started[reply.id] = ForkedWorker(reply.pid)
                else:
                    self._started[reply.id] = reply.error
                self._replied.notify_all()
        with self._lock:  # the server is gone, and its children with it (PR_SET_PDEATHSIG)
            self._gone = True
            for worker in self._workers.values():
                worker._exit(-signal.SIGKILL)
            self._workers.clear()
            self._replied.notify_all()


_server: WorkerForks | None = None
_server_lock = threading.Lock()


def worker_forks(environment: dict[str, str]) -> WorkerForks:
    """This process's fork server (started with ``environment`` on first use, or again if it died)."""
    global _server
    with _server_lock:
        if _server is None or not _server.alive:
            _server = WorkerForks(environment)
            atexit.register(_server.close)
        return _server


# -- the server --------------------------------------------------------------------------------


def serve() -> None:
    """Fork a worker per request line on standard input; report pids and exit codes on standard output."""
    from ecofl.pipeline.runtime import worker  # torch and the runtime, once for every child
    from ecofl.pipeline.runtime.heap import freeze_heap

    freeze_heap()  # the children's collections leave the shared pages alone

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the portal's to handle: it stops the workers
    server = os.getpid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([0, wake_r], [], [])
        if wake_r in readable:
            while _drained(wake_r):
                pass
        _reap(children)
        if 0 not in readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break  # the portal is done or dead
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            request = read_line(line, FORK_REQUESTS)
            try:
                pid = os.fork()
            except OSError as error:
                _reply(ForkFailed(request.id, str(error)))
                continue
            if pid == 0:
                _run_child(request, worker.main, server, (wake_r, wake_w))
            children.add(pid)
            _reply(Forked(request.id, pid))
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in children:
        os.waitpid(pid, 0)


def _drained(fd: int) -> bool:
    try:
        return bool(os.read(fd, 512))
    except BlockingIOError:
        return False


def _reap(children: set[int]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        children.discard(pid)
        _reply(Exited(pid, os.waitstatus_to_exitcode(status)))


def _reply(message: Forked | ForkFailed | Exited) -> None:
    write_line(sys.stdout, message)


def _run_child(request: Fork, main, server: int, server_fds: tuple[int, int]) -> None:
    """In the forked child of ``server``: become the worker the request describes; never return to the
    server's loop."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in server_fds:
            os.close(fd)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        die_with(server)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, request.name.encode()[:15])
        log = os.open(request.log, os.O_WRONLY | os.O_APPEND)  # from here on, errors go to the worker's log
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        for procs in request.cgroup_procs:  # before the worker allocates: its cgroup is charged for it
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        if request.namespace:
            with open(f"/run/netns/{request.namespace}") as f:
                if libc.setns(f.fileno(), _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {request.namespace}")
        os.environ.clear()
        os.environ.update(request.env)
        code = main(request.argv)
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child must never return into the server
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)
