"""``ecofl home infer``: the global model a run wrote, streamed through the home's devices; one JSON object."""

from __future__ import annotations

import json

import pytest
import torch

from ecofl.cli import main
from ecofl.data import load_dataset
from ecofl.fl.checkpoint import GLOBAL_MODEL
from ecofl.models import build_model
from ecofl.train import TrainConfig, train_local
from ecofl.weights import get_weights, save_weights

pytestmark = pytest.mark.timeout(300)


def test_home_infer_streams_a_run_s_global_model_and_reports_it(tmp_path, capsys):
    timeline = tmp_path / "stream.png"
    data = load_dataset("digits")
    torch.manual_seed(0)
    model = build_model("cnn", tuple(data.input_shape), data.num_classes)
    train_local(model, data.train.x, data.train.y, TrainConfig(epochs=2, batch_size=32, lr=0.05, seed=0))
    run_dir = tmp_path / "run"
    save_weights(run_dir / GLOBAL_MODEL, get_weights(model))  # what a simulation leaves behind

    code = main(["home", "infer", "--model", "cnn", "--pool", "nano-10w,tx2-maxn,nx", "--dataset", "digits",
                 "--checkpoint", str(run_dir), "--samples", "96", "--json", "--cache-dir", str(tmp_path),
                 "--emulate", "sleep", "--timeline", str(timeline)])
    assert code == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert timeline.stat().st_size > 0 and f"timeline written to {timeline}" in err
    assert {"throughput", "predicted_throughput", "latency_s", "accuracy", "stages"} <= set(report)
    assert report["accuracy"] > 0.5  # the trained model's predictions, not chance (0.1)
    assert report["throughput"] > 0 and report["latency_s"] > 0 and report["predicted_throughput"] > 0
    assert report["samples"] == 96 and report["emulation"] == "sleep"
    for stage in report["stages"]:
        assert {"devices", "layers", "busy_fraction"} <= set(stage)
        assert 0 < stage["busy_fraction"] <= 1


def test_home_infer_refuses_weights_of_another_model(tmp_path, capsys):
    save_weights(tmp_path / "other.npz", get_weights(build_model("cnn", (1, 28, 28), 10)))
    code = main(["home", "infer", "--model", "cnn", "--pool", "nano-10w", "--dataset", "digits",
                 "--weights", str(tmp_path / "other.npz"), "--cache-dir", str(tmp_path)])
    assert code == 2
    assert "are not those of cnn" in capsys.readouterr().err
