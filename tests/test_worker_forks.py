"""The fork server that starts a portal's workers: exit codes, signals, nothing outliving the portal, frozen heaps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ecofl.devices import DeviceSpec, HomePool
from ecofl.net.netns import HomeNetwork, unavailable_reason
from ecofl.pipeline.runtime.launch import LocalDevices
from ecofl.pipeline.runtime.worker_forks import WORKER_NAME, worker_forks
from processes import fork_servers, worker_processes
from helpers import SECRET

ROOT = Path(__file__).resolve().parents[1]
NETNS_REASON = unavailable_reason()


def silent_portal() -> socket.socket:
    """A port that accepts connections and never says anything: a worker waits there for its handshake."""
    return socket.create_server(("127.0.0.1", 0))


def test_a_worker_builds_its_optimizer_without_importing_anything():
    """An optimizer's first construction imports torch's compiler (1.85 CPU-s here, ten times that in a Nano's
    quota): the worker module imports it as a process starts (the fork server, a daemon), so a worker entering
    its first epoch, inside its device's quota, imports nothing more."""
    probe = textwrap.dedent("""
        import sys
        import ecofl.pipeline.runtime.worker
        import torch
        before = set(sys.modules)
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        print(sorted(set(sys.modules) - before))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_forked_worker_reports_its_exit_code_and_its_log():
    devices = LocalDevices()
    with socket.create_server(("127.0.0.1", 0)) as closed:
        port = closed.getsockname()[1]
    try:
        devices.start(0, ("127.0.0.1", port), b"")  # no secret: the worker refuses to start
        assert devices.processes[0].wait(timeout=120) == 2
        assert "set ECOFL_HOME_SECRET" in devices.log_tail(0)
        assert devices.exited() == {0: 2}
    finally:
        devices.stop()


def test_a_killed_worker_is_reported_killed_and_named_for_its_device():
    devices = LocalDevices()
    with silent_portal() as portal:
        try:
            devices.start(3, portal.getsockname(), SECRET)
            pid = devices.pids[3]
            deadline = time.time() + 30  # the child names itself just after the fork
            while Path(f"/proc/{pid}/comm").read_text().strip() != f"{WORKER_NAME}3" and time.time() < deadline:
                time.sleep(0.05)
            assert Path(f"/proc/{pid}/comm").read_text().strip() == f"{WORKER_NAME}3"
            assert worker_processes() == [pid]
            devices.signal(3, signal.SIGKILL)
            assert devices.processes[3].wait(timeout=60) == -signal.SIGKILL
        finally:
            devices.stop()
    assert worker_processes() == []


def test_a_frozen_worker_is_still_killed_and_reaped_by_stop():
    devices = LocalDevices()
    with silent_portal() as portal:
        devices.start(0, portal.getsockname(), SECRET)
        devices.start(1, portal.getsockname(), SECRET)
        devices.signal(1, signal.SIGSTOP)
        devices.stop(grace_s=0.5)
    assert devices.exited() == {0: -signal.SIGKILL, 1: -signal.SIGKILL}
    assert worker_processes() == []


def test_a_killed_fork_server_takes_its_workers_with_it_and_the_next_start_brings_up_another():
    devices = LocalDevices()
    with silent_portal() as portal:
        try:
            devices.start(0, portal.getsockname(), SECRET)
            first = worker_forks({})  # the running server (the argument only counts when none runs)
            first.process.kill()
            assert devices.processes[0].wait(timeout=60) == -signal.SIGKILL
            deadline = time.time() + 30  # the worker dies with its server (PR_SET_PDEATHSIG)
            while devices.pids[0] in worker_processes() and time.time() < deadline:
                time.sleep(0.05)
            assert devices.pids[0] not in worker_processes()
            devices.start(1, portal.getsockname(), SECRET)
            assert worker_forks({}) is not first and devices.processes[1].poll() is None
        finally:
            devices.stop(grace_s=0.5)


PORTAL_SCRIPT = textwrap.dedent("""
    import socket, sys, time
    from ecofl.pipeline.runtime.launch import LocalDevices
    portal = socket.create_server(("127.0.0.1", 0))
    devices = LocalDevices()
    for device in range(2):
        devices.start(device, portal.getsockname(), bytes(range(32)))
    print(" ".join(str(pid) for pid in devices.pids.values()), flush=True)
    time.sleep(600)
""")


def test_a_portal_killed_with_sigkill_leaves_no_worker_and_no_fork_server():
    process = subprocess.Popen([sys.executable, "-c", PORTAL_SCRIPT], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line, process.stderr.read()
        workers = [int(pid) for pid in line.split()]
        deadline = time.time() + 30  # each names itself just after its fork
        while sorted(worker_processes(process.pid)) != sorted(workers) and time.time() < deadline:
            time.sleep(0.05)
        assert sorted(worker_processes(process.pid)) == sorted(workers)
        assert len(workers) == 2 and len(fork_servers(process.pid)) == 1
    finally:
        process.kill()
        process.wait()
    deadline = time.time() + 30
    while (worker_processes(process.pid) or fork_servers(process.pid)) and time.time() < deadline:
        time.sleep(0.1)
    assert worker_processes(process.pid) == [] and fork_servers(process.pid) == []


@pytest.mark.skipif(NETNS_REASON is not None, reason=str(NETNS_REASON))
def test_a_worker_started_in_a_namespace_runs_in_that_namespace():
    pool = HomePool("t", (DeviceSpec("dev0", 1.0, 1 << 30, 1e6),))
    devices = LocalDevices()
    with HomeNetwork(pool, [0]) as network, silent_portal() as portal:
        try:
            devices.start(0, portal.getsockname(), SECRET, network.namespace(0))
            pid = devices.pids[0]
            namespace = os.stat(f"/run/netns/{network.namespace(0)}").st_ino
            deadline = time.time() + 30  # the child enters the namespace just after the fork
            while os.stat(f"/proc/{pid}/ns/net").st_ino != namespace and time.time() < deadline:
                time.sleep(0.05)
            assert os.stat(f"/proc/{pid}/ns/net").st_ino == namespace != os.stat("/proc/self/ns/net").st_ino
        finally:
            devices.stop(grace_s=0.5)


def test_a_frozen_heap_leaves_full_collections_only_what_came_after():
    """A worker freezes torch's and its model's objects once built (.heap), so a full collection, which holds
    the GIL a confined device's heartbeat needs, walks only what the process allocated since."""
    script = (
        "import gc, json\n"
        "from ecofl.models import build_model\n"
        "from ecofl.pipeline.runtime.heap import freeze_heap\n"
        "model = build_model('mobilenet_v2', (1, 28, 28), 10)\n"
        "tracked = len(gc.get_objects())\n"
        "frozen = freeze_heap()\n"
        "garbage = [[i] for i in range(1000)]\n"
        "print(json.dumps([tracked, frozen, len(gc.get_objects())]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    tracked, frozen, walked = json.loads(out.stdout)
    assert tracked > 100_000  # torch's modules and the model: what a full pass walked before
    assert frozen >= 0.9 * tracked
    assert 1000 <= walked < 0.02 * tracked  # what came after the freeze, and nothing much else



#: Loaded into every Python process of the test (PYTHONPATH): each call that would initialise CUDA is written to
#: $CUDA_CALLS_LOG as "pid name", before it runs (where there is no GPU it then fails or says False, as it would).
CUDA_PROBE = textwrap.dedent("""
    import functools, os
    import torch

    def _probe(name, call):
        @functools.wraps(call)
        def probed(*args, **kwargs):
            with open(os.environ["CUDA_CALLS_LOG"], "a") as log:
                log.write(f"{os.getpid()} {name}\\n")
            return call(*args, **kwargs)
        return probed

    for _name in ("_lazy_init", "init", "is_available", "device_count", "current_device", "synchronize"):
        setattr(torch.cuda, _name, _probe(_name, getattr(torch.cuda, _name)))
""")

TRAIN_TWO_DEVICES = textwrap.dedent("""
    from ecofl.pipeline.plan import Plan, StagePlan
    from ecofl.pipeline.runtime import worker_forks
    from ecofl.pipeline.runtime.portal import HomePipeline
    from pipeline_kit import WITHOUT_BATCH_NORM, data, pool
    from ecofl.weights import get_weights

    plan = Plan("hand", (StagePlan((0, 1), (0,), (8,), 1), StagePlan((2, 4), (1,), (8,), 1)), micro_batch=8,
                num_micro_batches=2)
    x, y = data(16)
    with HomePipeline(WITHOUT_BATCH_NORM, pool(2), plan, emulate="none", timeout_s=60) as home:
        home.train(None, x, y, sync_rounds=1, lr=0.1)
    print(worker_forks._server.process.pid, flush=True)
""")


def test_the_fork_server_never_initialises_cuda_and_the_probe_would_see_it(tmp_path):
    """Workers initialise CUDA after their fork; a CUDA context in the fork server would be broken in every child.

    A probe on torch.cuda's entry points logs every process that reaches one: the fork server of a home that
    trains one sync-round on two devices never does, and a process that asks ``is_available`` is seen."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(CUDA_PROBE)
    log = tmp_path / "cuda_calls.log"
    paths = [str(site), str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths),
           "CUDA_CALLS_LOG": str(log)}
    asking = subprocess.run([sys.executable, "-c", "import os, torch; torch.cuda.is_available(); print(os.getpid())"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert f"{asking.stdout.strip()} is_available" in log.read_text().splitlines()  # the probe sees a call
    home = subprocess.run([sys.executable, "-c", TRAIN_TWO_DEVICES], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert home.returncode == 0, home.stderr[-3000:]
    server = home.stdout.split()[-1]
    calls = log.read_text().splitlines()
    assert [line for line in calls if line.split()[0] == server] == []
