"""A simulation that joins a running two-node Ray cluster by address (docs/simulation.md, "On a Ray cluster").

Both nodes run on this machine, on loopback, each with a temp dir of its own
and free ports, one CPU each (so one actor per node). ``ray stop`` would stop
every Ray on the machine (other people's too), so the nodes are stopped by
their processes: those whose command line names this test's temp dirs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ecofl.errors import UserError
from simulations.ray_cluster import check_reachable
from processes import processes_matching
from helpers import free_ports

# A Ray cluster of its own on free ports, beside the private instances of the simulations in group "flower"
# (tests/test_simulation.py: the groups).
pytestmark = pytest.mark.xdist_group("flower_b")

ROOT = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")


def processes_naming(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    return [int(line.split(":", 1)[0]) for line in processes_matching(text)
            if int(line.split(":", 1)[0]) != os.getpid()]


def stop_processes_naming(*texts: str, grace_s: float = 5.0) -> None:
    """SIGTERM the processes naming any of ``texts``, then SIGKILL what is left after ``grace_s``.

    Ray's gcs_server, raylet and autoscaler monitor of a ``ray start`` node outlive a SIGTERM by more than
    10 s here (they are only test clusters: a longer grace only holds the test's xdist worker).
    """
    def alive() -> list[int]:
        return [pid for text in texts for pid in processes_naming(text)]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 20.0)
        while alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not alive():
            return


def start_node(temp_dir: Path, head_port: int, head: bool) -> None:
    """``ray start`` one node of one CPU on loopback with ports of its own."""
    agent, agent_grpc, metrics, runtime_env, client = free_ports(5)
    command = [
        str(RAY), "start", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--num-gpus=0",
        f"--temp-dir={temp_dir}", "--disable-usage-stats", "--include-log-monitor=false",
        f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
    ]
    if head:
        command += ["--head", f"--port={head_port}", "--include-dashboard=false",
                    f"--ray-client-server-port={client}"]
    else:
        command += [f"--address=127.0.0.1:{head_port}"]
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    subprocess.run(command, check=True, capture_output=True, timeout=180, env=environment)


@pytest.fixture()
def two_node_cluster() -> Iterator[str]:
    """A head and a worker node on this machine; their address; both stopped afterwards, also on failure."""
    head_dir = Path(tempfile.mkdtemp(prefix="ecofl-rh-"))  # short: Ray's socket paths must stay below 108 bytes
    worker_dir = Path(tempfile.mkdtemp(prefix="ecofl-rw-"))
    (port,) = free_ports(1)
    try:
        start_node(head_dir, port, head=True)
        start_node(worker_dir, port, head=False)
        yield f"127.0.0.1:{port}"
    finally:
        stop_processes_naming(str(worker_dir), str(head_dir))
        assert not processes_naming(str(head_dir)) and not processes_naming(str(worker_dir))
        for directory in (worker_dir, head_dir):
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
def test_a_simulation_joins_a_two_node_cluster_and_homes_train_on_both_nodes(two_node_cluster, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "simulations.run", "homes=20", "dataset=digits", "loop.max_updates=4",
               "train.epochs=1", "plot=false", f"simulation.address={two_node_cluster}",
               "loop.homes_per_round=4", f"hydra.run.dir={out}"]
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=environment)
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    timing = json.loads((out / "timing.json").read_text())
    assert summary["updates"] == 4 and summary["failed_total"] == 0
    by_node = timing["replies_by_node"]
    assert len(by_node) == 2 and all(count > 0 for count in by_node.values()), by_node  # both nodes trained
    assert sum(by_node.values()) == timing["train_replies"]


def test_an_address_where_no_cluster_answers_is_a_clear_error():
    (port,) = free_ports(1)  # closed again: nothing listens there
    with pytest.raises(UserError, match=f"no Ray cluster answers at 127.0.0.1:{port}.*ray start --head"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=5)
    with pytest.raises(UserError, match="HOST:PORT"):
        check_reachable("somewhere")
