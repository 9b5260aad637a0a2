"""End to end: Flower simulations of Eco-FL (on a SuperLink of their own, the Hydra entry point, `flwr run`).

Every test checks that the processes it started are gone afterwards: every
process of a simulation's SuperLink (flwr-simulation, Ray, its workers)
carries the SuperLink's marker in its environment, and the SuperLink of
``scripts/flwr_run.sh`` must not outlive the script.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from client.federation import federation
from ecofl.fl.inprocess import InProcessTransport
from ecofl.fl.loop import EventLoop
from server.config import experiment
from server.evaluation import GlobalEvaluator
from simulations.local_superlink import marked_processes
from simulations.run import simulate
from helpers import wait_for
from processes import processes_matching

# Simulations run in two xdist groups, "flower" and "flower_b", one at a time within each: every one is a
# SuperLink, a private Ray instance (RAY_ADDRESS=local) and its workers, so at most two share the machine.
pytestmark = pytest.mark.xdist_group("flower")

ROOT = Path(__file__).resolve().parents[1]

SMALL = {
    "homes": 50,
    "dataset": {"name": "digits"},
    "latency": {"kind": "paper", "mean_s": 10.0, "std_s": 3.0},
    "train": {"epochs": 1, "batch_size": 10, "lr": 0.05, "mu": 0.05},
    "loop": {"max_updates": 6, "requery_every": 3, "target_accuracy": 0.2},
    "server": {"eval_samples": None},
}
COMPARED = ("update", "virtual_time", "accuracy", "loss", "group", "homes", "staleness", "alpha", "train_loss",
            "group_sizes", "waiting")


def assert_simulation_gone(driver: int, grace_s: float = 20.0) -> None:
    """No process of a SuperLink that ``driver`` started is left: the SuperLink, flwr-simulation, Ray and its
    workers all carry its marker in their environment (simulations/local_superlink.py)."""
    deadline = time.monotonic() + grace_s
    while (left := marked_processes(driver=driver)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"processes of a simulation's SuperLink still running: {left}"


@pytest.mark.slow
def test_flower_simulation_of_50_homes_equals_the_loop_without_flower(tmp_path):
    """run_simulation: 50 homes, a few global updates, metrics written; Flower changes no number."""
    exp = experiment(SMALL)
    summary = simulate(exp, tmp_path / "flower", progress=False)
    assert_simulation_gone(os.getpid())

    assert summary["updates"] == 6 and summary["num_homes"] == 50
    assert summary["failed_total"] == 0 and summary["rejected_total"] == 0
    with open(tmp_path / "flower" / "metrics.csv") as handle:
        assert len(list(csv.DictReader(handle))) == 6
    flower_rows = json.loads((tmp_path / "flower" / "metrics.json").read_text())

    fed = federation(exp.setup.to_json())
    transport = InProcessTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts,
                                   fed.latency_model, num_classes=fed.dataset.num_classes)
    evaluator = GlobalEvaluator(exp)
    loop = EventLoop(exp.loop, transport, range(50), evaluator.initial_weights(), evaluator, progress=False)
    local_rows = loop.run()
    assert [{k: r[k] for k in COMPARED} for r in flower_rows] == [{k: r[k] for k in COMPARED} for r in local_rows]


@pytest.mark.slow
def test_flower_simulation_on_the_wall_clock_applies_rounds_as_their_replies_arrive(tmp_path):
    """No latency model: homes probe their round time, the loop applies Flower replies as they arrive."""
    settings = {**SMALL, "homes": 12, "latency": {}, "grouping": {"num_groups": 2},
                "loop": {"max_updates": 4, "requery_every": 0}}
    summary = simulate(experiment(settings), tmp_path, progress=False)
    assert_simulation_gone(os.getpid())
    assert summary["updates"] == 4 and summary["failed_total"] == 0 and summary["rt_s"] > 0
    rows = json.loads((tmp_path / "metrics.json").read_text())
    times = [row["virtual_time"] for row in rows]  # wall seconds on this clock
    assert times == sorted(times) and 0 < times[-1] <= summary["wall_time_s"]
    assert all(row["homes"] >= 1 for row in rows)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_stops_a_simulation_at_once_and_keeps_what_it_applied(tmp_path, signum):
    """SIGINT to the process group, as a terminal's Ctrl-C, or SIGTERM, as ``kill`` of a sweep's session: Ray's
    workers die with it, the run must not hang, and nothing it started outlives it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "simulations.run", "+experiment=smoke", "homes=12", "loop.max_updates=100000",
         "loop.target_accuracy=null", "loop.checkpoint_every=1", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not any((tmp_path / "checkpoints").glob("*.json")):  # an update has been applied
            assert process.poll() is None and time.monotonic() < deadline, "the run never applied an update"
            time.sleep(0.2)
        os.killpg(process.pid, signum)
        output, _ = process.communicate(timeout=60)  # stops within a minute, or TimeoutExpired fails the test
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output[-3000:]
    assert_simulation_gone(process.pid)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "stopped" and summary["updates"] >= 1
    assert len(json.loads((tmp_path / "metrics.json").read_text())) == summary["updates"]


def flwr_run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": "39191", "FLWR_LOCAL_CONTROL_API_PORT": "39193"}
    return subprocess.run(
        ["bash", "scripts/flwr_run.sh", *overrides, f"out_dir={tmp_path}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.slow
def test_flwr_run_uses_pyproject_defaults_and_fails_visibly(tmp_path):
    done = flwr_run(tmp_path / "ok", "homes=8", "dataset.name=digits", "loop.max_updates=3", "train.epochs=1",
                    "server.eval_samples=")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "status: finished:completed" in done.stdout
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["updates"] == 3

    failed = flwr_run(tmp_path / "bad", "homes=5", "dataset.name=no_such_dataset")
    assert failed.returncode != 0
    assert "finished:failed" in failed.stdout
    wait_for(lambda: not processes_matching("--port 39191", "127.0.0.1:39191"), timeout_s=30,
             what="flwr_run.sh's SuperLink gone")


def hydra_run(tmp_path: Path, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simulations.run", *overrides, f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.xdist_group("flower_b")
def test_homes_batched_or_one_at_a_time_give_the_same_run(tmp_path):
    """The smoke experiment with batch_homes=on through Flower (CPU) against the same experiment's loop with
    every home trained alone (off; the loop's numbers are Flower's: the first test): same groups, update times
    and stragglers, the same accuracies within 0.01 (IID homes, 5 epochs and momentum, so that the accuracy
    moves); summary.json says where the homes trained and that they were batched."""
    learning = ["partition=iid", "train.epochs=5", "train.momentum=0.5", "loop.max_updates=8",
                "loop.target_accuracy=null", "simulation.device=cpu"]
    done = hydra_run(tmp_path / "on", "+experiment=smoke", *learning, "simulation.batch_homes=on")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "on" / "summary.json").read_text())
    assert summary["device"] == "cpu" and summary["batch_homes"] is True
    assert summary["updates"] == 8 and summary["failed_total"] == 0
    batched = json.loads((tmp_path / "on" / "metrics.json").read_text())

    exp = experiment(composed("+experiment=smoke", *learning, "simulation.batch_homes=off"))
    fed = federation(exp.setup.to_json())
    transport = InProcessTransport(fed.new_model, fed.dataset.train.x, fed.dataset.train.y, fed.parts,
                                   fed.latency_model, num_classes=fed.dataset.num_classes)
    evaluator = GlobalEvaluator(exp)
    alone = EventLoop(exp.loop, transport, range(exp.setup.num_homes), evaluator.initial_weights(), evaluator,
                      progress=False).run()
    assert transport.batched_run == 0
    for on, off in zip(batched, alone, strict=True):
        for key in ("update", "virtual_time", "group", "homes", "stragglers", "group_sizes", "waiting"):
            assert on[key] == off[key], key
        assert on["accuracy"] == pytest.approx(off["accuracy"], abs=0.01)
    assert max(r["accuracy"] for r in batched) > 0.3  # it learned: the comparison means something


def composed(*overrides: str) -> dict:
    """The Hydra config the command line's overrides give (as simulations.run composes it)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="config", overrides=list(overrides)), resolve=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_one_line_and_nothing_starts(tmp_path):
    done = hydra_run(tmp_path / "run", "+experiment=smoke", "simulation.device=cuda", timeout=120)
    assert done.returncode != 0
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(errors) == 1 and "simulation.device=cuda" in errors[0] and "CUDA" in errors[0], errors
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()  # nothing ran: no output folder


@pytest.mark.slow
@pytest.mark.xdist_group("flower_b")
def test_homes_that_fail_are_counted_by_kind_and_shown_once_per_kind(tmp_path):
    """The Hydra smoke experiment, in which 16 of 50 homes train through a pipeline on a pool their model cannot
    fit: every round they are in fails. summary.json counts the failures by kind, the terminal shows the kind in
    two lines (the first failure, the count at the end), home_failures.log lists each, the run (mostly updates)
    exits 0 with the smoke experiment's outputs, and nothing is left running."""
    pool = tmp_path / "tiny.yaml"
    pool.write_text("name: tiny\nbandwidth_mbps: 100\ndevices:\n"
                    "  - {name: crumb-a, speed: 0.5, memory_gb: 0.0001, bandwidth_mbps: 100}\n"
                    "  - {name: crumb-b, speed: 0.5, memory_gb: 0.0001, bandwidth_mbps: 100}\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "simulations.run", "+experiment=smoke", "simulation.device=cpu",
         f"pipeline_home.homes=[{','.join(map(str, range(16)))}]", f"pipeline_home.pool={pool}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert_simulation_gone(process.pid)
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    failed = summary["home_failures"]["train:pipeline_failed"]
    assert failed["count"] == summary["failed_total"] > 0 and "fits pool 'tiny' in no way" in failed["first"]
    output = (done.stdout + done.stderr).splitlines()
    terminal = [line for line in output if "train:pipeline_failed" in line and "summary: {" not in line]
    assert len(terminal) == 2, terminal
    listed = (tmp_path / "run" / "home_failures.log").read_text().splitlines()
    assert len(listed) == failed["count"] and "Traceback" not in done.stderr
    # the smoke experiment's outputs, and a terminal without Flower's deprecation warnings or tracebacks
    assert summary["updates"] == 6 and summary["num_homes"] == 50
    assert {"final_accuracy", "best_accuracy", "time_to_target_s", "waiting_homes"} <= set(summary)
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 7  # header + 6 updates
    assert (tmp_path / "run" / "accuracy.png").stat().st_size > 0
    assert (tmp_path / "run" / "global_model.npz").stat().st_size > 0  # for ecofl home infer --checkpoint
    assert not [line for line in output if "deprecat" in line.lower() or "Traceback" in line]
