"""``ecofl plan`` end to end on a tiny model: JSON shape, table, Gantt, one-line errors."""

from __future__ import annotations

import json

import pytest

from ecofl.cli import main

TINY = ["--model", "cnn", "--input-shape", "1,28,28", "--batch", "32"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("profiles"))


@pytest.mark.parametrize("planner", ["ecofl", "hpp", "pipeedge", "even", "dp"])
def test_json_has_the_required_keys(planner, cache, capsys):
    code = main(["plan", *TINY, "--pool", "ecofl-3stage", "--planner", planner, "--json", "--cache-dir", cache])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["planner"] == planner and report["objective"] == "training"
    assert report["sync_round_s"] > 0 and report["throughput"] > 0
    assert report["micro_batch"] * report["num_micro_batches"] == 32
    layers = [tuple(st["layers"]) for st in report["stages"]]
    assert layers[0][0] == 0 and layers[-1][1] == report["num_layers"] - 1
    for st in report["stages"]:
        assert {"devices", "layers", "memory_bytes", "in_flight", "shares", "stage_time_s"} <= set(st)
        if len(st["devices"]) == 1:  # a replicated stage's peak and tightest budget may be different devices
            assert st["memory_bytes"] <= st["budget_bytes"]


def test_table_and_gantt(cache, tmp_path, capsys):
    gantt = tmp_path / "round.png"
    code = main(["plan", *TINY, "--pool", "nano-10w,tx2-maxn", "--bandwidth", "1000", "--granularity", "fine",
                 "--cache-dir", cache, "--gantt", str(gantt)])
    out = capsys.readouterr().out
    assert code == 0
    assert "K_p" in out and "predicted sync-round" in out and "samples/s" in out
    assert gantt.stat().st_size > 0


@pytest.mark.parametrize("planner", ["ecofl", "hpp", "pipeedge", "even", "dp"])
def test_inference_json_has_throughput_latency_and_busy_fractions(planner, cache, capsys):
    code = main(["plan", *TINY, "--pool", "ecofl-3stage", "--planner", planner, "--inference", "--json",
                 "--cache-dir", cache])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["objective"] == "inference" and report["schedule"] == "stream" and report["planner"] == planner
    assert report["throughput"] > 0 and report["first_latency_s"] > 0
    # a loaded pipeline is never faster per sample than an empty one (up to the rounding of a mean of equal floats)
    assert report["latency_s"] >= report["first_latency_s"] * (1 - 1e-9)
    assert report["throughput"] * report["period_s"] == pytest.approx(report["micro_batch"])
    assert "sync_round_s" not in report
    for st in report["stages"]:
        assert {"devices", "layers", "memory_bytes", "in_flight", "stage_time_s", "send_s", "busy_fraction"} <= set(st)
        assert 0 < st["busy_fraction"] <= 1 and 1 <= st["in_flight"] <= 3
        if len(st["devices"]) == 1:
            assert st["memory_bytes"] <= st["budget_bytes"]
    slowest = max(max(st["stage_time_s"], st["send_s"]) for st in report["stages"])
    assert slowest <= report["period_s"] * (1 + 1e-9)  # the steady state runs at the pace of its slowest resource


def test_inference_table_and_stream_gantt(cache, tmp_path, capsys):
    gantt = tmp_path / "stream.png"
    code = main(["plan", *TINY, "--pool", "nano-10w,tx2-maxn", "--inference", "--planner", "pipeedge",
                 "--cache-dir", cache, "--gantt", str(gantt)])
    out = capsys.readouterr().out
    assert code == 0
    assert "inference plan" in out and "held" in out and "samples/s (steady state)" in out and "latency" in out
    assert gantt.stat().st_size > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--pool", ""], "empty pool"),
        (["--pool", "asteroid-a", "--bandwidth", "0"], "bandwidth must be positive"),
        (["--pool", "nano-10w,toaster"], "unknown pool or device preset 'toaster'"),
        (["--pool", "mansion"], "unknown pool or device preset 'mansion'"),
        (["--pool", "asteroid-a", "--planner", "magic"], "(choose from 'ecofl', 'hpp', 'pipeedge', 'even', 'dp')"),
        (["--pool", "asteroid-a", "--model", "nope"], "invalid choice: 'nope' (choose from 'cnn', 'mobilenet_v2'"),
        (["--pool", "asteroid-a", "--granularity", "atoms"], "invalid choice: 'atoms' (choose from 'block', 'fine')"),
        (["--pool", "asteroid-a", "--input-shape", "28,28"], "input-shape"),
    ],
)
def test_bad_input_is_one_line_error(args, message, cache, capsys):
    argv = ["plan", *TINY, "--cache-dir", cache]
    code = main(argv + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
