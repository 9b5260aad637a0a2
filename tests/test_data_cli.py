"""``ecofl data info`` and ``ecofl data partition`` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ecofl.cli import main
from ecofl.data import DATASETS

DEBIAN = Path("/usr/share/datasets/fashion-mnist")


def run_json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_info_digits_json(capsys):
    report = run_json(capsys, ["data", "info", "digits", "--json"])
    assert (report["train"], report["test"]) == (1437, 360)
    assert report["input_shape"] == [1, 8, 8] and report["num_classes"] == 10
    assert report["source"] == "sklearn:load_digits"


@pytest.mark.skipif(not DEBIAN.is_dir(), reason="Debian's dataset-fashion-mnist is not installed")
def test_info_fashion_mnist_reports_the_real_files(capsys):
    report = run_json(capsys, ["data", "info", "fashion_mnist", "--json"])
    assert (report["train"], report["test"]) == (60000, 10000)
    assert report["source"] == f"debian:{DEBIAN}"


def test_unknown_dataset_exits_2_listing_names(capsys):
    assert main(["data", "info", "imagenet"]) == 2
    error = capsys.readouterr().err
    assert all(name in error for name in DATASETS)


def test_mnist_missing_offline_exits_2_with_how_to(capsys, tmp_path):
    assert main(["data", "info", "mnist", "--root", str(tmp_path)]) == 2
    assert "--download" in capsys.readouterr().err


def test_partition_json_has_clients_groups_and_summary(capsys):
    report = run_json(capsys, ["data", "partition", "digits", "--scheme", "rlg-niid",
                               "--clients", "20", "--seed", "3", "--json"])
    assert report["parameters"] == {"classes_per_client": 2, "num_groups": 5, "classes_per_group": 3}
    assert len(report["clients"]) == 20
    assert sum(c["size"] for c in report["clients"]) == 1437
    assert all(sum(c["histogram"]) == c["size"] for c in report["clients"])
    assert [len(g["classes"]) for g in report["groups"]] == [3] * 5
    summary = report["summary"]
    assert summary["classes_min"] == summary["classes_max"] == 2
    assert 0 < summary["js_to_uniform_mean"] <= 1


def test_partition_text_is_compact(capsys):
    assert main(["data", "partition", "digits", "--scheme", "shards", "--clients", "50"]) == 0
    out = capsys.readouterr().out
    assert "30 more clients" in out and "mean JS divergence" in out
    assert len(out.splitlines()) < 35


def test_partition_plot_writes_png(capsys, tmp_path):
    path = tmp_path / "labels.png"
    assert main(["data", "partition", "digits", "--scheme", "dirichlet", "--alpha", "0.3",
                 "--clients", "15", "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_partition_impossible_setting_exits_2(capsys):
    assert main(["data", "partition", "digits", "--scheme", "rlg-niid", "--clients", "20",
                 "--groups", "3"]) == 2
    assert "groups * classes_per_group" in capsys.readouterr().err
