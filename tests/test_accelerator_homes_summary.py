"""benchmarks/accelerator_homes.py's rows and table, from ``ecofl home train --json`` reports (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.accelerator_homes import markdown, row
from benchmarks.pipeline_accelerators import merge


def report(sync_round_s: float, predicted_s: float) -> dict:
    """A mixed home's report as ``ecofl home train --json`` gives it: its devices listed in stage order."""
    return {"planner": "ecofl", "num_micro_batches": 8, "micro_batch": 8, "batch_size": 64, "rounds_completed": 5,
            "sync_round_s": sync_round_s, "predicted_sync_round_s": predicted_s, "throughput": 64 / sync_round_s,
            "predicted_throughput": 64 / predicted_s, "sync_rounds_s": [sync_round_s] * 5,
            "stages": [{"layers": [0, 9], "devices": [1]}, {"layers": [10, 10], "devices": [0]},
                       {"layers": [11, 21], "devices": [2]}],
            "devices": [{"device": 1, "accelerator": "cuda", "speed": 13.0},
                        {"device": 0, "accelerator": "cpu", "speed": 1.0},
                        {"device": 2, "accelerator": "cuda", "speed": 9.9}]}


def test_a_row_gives_the_planner_error_and_the_plan_by_where_each_stage_trains():
    measured = row("mobilenet_v2", "mixed", report(0.104, 0.075), wall_s=100.0, load=1.0)
    assert measured["planner_error"] == pytest.approx(0.029 / 0.104)
    assert measured["plan"] == "ecofl 8x8 [0-9: cuda | 10-10: cpu | 11-21: cuda]"
    assert measured["accelerators"] == ["cpu", "cuda", "cuda"] and measured["speeds"] == [1.0, 13.0, 9.9]
    assert measured["accelerator"] == "cuda" and measured["exact"] is None  # exactness is the other table's


def test_the_table_escapes_the_plans_bars_and_says_when_no_gpu_row_is_measured():
    cpu = row("mobilenet_v2", "cpu", report(0.555, 0.581), wall_s=40.0, load=0.2)
    gpu = {**row("mobilenet_v2", "mixed", report(0.104, 0.075), wall_s=100.0, load=1.0), "speedup_vs_cpu": 5.34}
    table = markdown([cpu])
    assert "not measured" in table and "cuda \\| 10-10" in table
    table = markdown(merge([cpu], [gpu], ("machine", "model", "home")))
    assert "not measured" not in table and "| 5.3x |" in table and "27.9%" in table
    assert len(table.splitlines()) == 4  # header, rule and the two homes


def test_the_fashion_mnist_slice_carried_to_a_gpu_machine_loads_as_its_first_images(tmp_path):
    from ecofl.data.datasets import DEBIAN_FASHION_MNIST, load_dataset
    from benchmarks.accelerator_homes import slice_fashion_mnist

    if not (DEBIAN_FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip(f"Debian's dataset-fashion-mnist is not installed ({DEBIAN_FASHION_MNIST})")
    sliced = load_dataset("fashion_mnist", slice_fashion_mnist(tmp_path, train=50, test=20), False)
    whole = load_dataset("fashion_mnist", None, False)
    assert sliced.train.x.shape[0] == 50 and sliced.test.x.shape[0] == 20
    assert (sliced.train.y == whole.train.y[:50]).all() and (sliced.test.y == whole.test.y[:20]).all()
    # normalised on the slice's own mean and deviation: the same images up to that affine map
    def standard(x):
        flat = x.flatten(1)
        return (flat - flat.mean(1, keepdim=True)) / flat.std(1, keepdim=True)

    assert torch.allclose(standard(sliced.train.x), standard(whole.train.x[:50]), atol=1e-4)
