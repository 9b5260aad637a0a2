"""Hydra configs, the flwr run config and the plots, without running a simulation."""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from ecofl.errors import UserError
from ecofl.fl.latency import PAPER_DEGREES
from server.config import experiment, experiment_from_run_config, with_pipeline_rounds
from simulations.plot import Run, accuracy_panels, plot_run, plot_sweep, seed_summary

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="config", overrides=list(overrides)), resolve=True)


def flat(settings: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value
    return out


def test_defaults_follow_the_paper():
    exp = experiment(composed())
    assert exp.setup.num_homes == 300 and exp.setup.dataset["name"] == "fashion_mnist"
    assert exp.setup.partition == {"scheme": "shards", "classes_per_client": 2}
    assert exp.loop.max_concurrent == 20 and exp.loop.num_groups == 5 and exp.loop.strategy == "ecofl"
    assert exp.loop.train == {"epochs": 3, "batch_size": 10, "lr": 0.05, "momentum": 0.0, "mu": 0.05}
    assert exp.setup.latency["num_homes"] == 300 and exp.setup.latency["kind"] == "paper"


def test_pyproject_run_config_equals_the_hydra_defaults():
    """flwr run and simulations.run start from the same settings ("" is null; lists keep library defaults)."""
    hydra_defaults = {k: ("" if v is None else v) for k, v in flat(composed()).items()
                      if k != "plot" and not isinstance(v, list)}
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    run_config = flat(pyproject["tool"]["flwr"]["app"]["config"])
    assert run_config.pop("out_dir")
    assert run_config.pop("experiment_file") == ""  # only simulations.run sets it
    assert run_config == hydra_defaults
    settings = composed()
    assert tuple(settings["latency"].pop("degrees")) == PAPER_DEGREES  # what flwr run gets by default
    assert experiment_from_run_config(run_config) == experiment({**settings, "out_dir": None})


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_every_experiment_composes_into_valid_settings(name):
    settings = composed(f"+experiment={name}")
    exp = experiment(settings)
    assert exp.setup.num_homes >= 50
    sweep = settings["hydra"]["sweeper"]["params"] if "hydra" in settings else {}
    for strategy in str(sweep.get("strategy", exp.loop.strategy)).split(","):
        experiment(composed(f"+experiment={name}", f"strategy={strategy}"))


@pytest.mark.parametrize("strategy", sorted(p.stem for p in (CONF / "strategy").glob("*.yaml")))
def test_every_strategy_config_is_a_valid_loop_config(strategy):
    assert experiment(composed(f"strategy={strategy}")).loop.strategy == strategy


def test_unknown_or_invalid_settings_are_user_errors():
    with pytest.raises(UserError, match="unknown loop setting"):
        experiment({"loop": {"max_update": 5}})
    with pytest.raises(UserError, match="alpha must lie"):
        experiment({"strategy": {"name": "ecofl", "alpha": 2.0}})
    with pytest.raises(UserError, match="unknown strategy"):
        experiment({"strategy": {"name": "fedsgd"}})


def test_simulation_backend_runs_the_configured_actors():
    config = experiment({"simulation": {"actors": 3, "cpus_per_actor": 0.5}}).simulation.backend_config()
    assert config["client_resources"]["num_cpus"] == 0.5
    assert config["init_args"]["num_cpus"] == 2  # 3 actors of half a CPU fit in 1.5 -> 2 CPUs


def fake_run(directory: Path, lam: float, accuracies: list[float], js: float, latency: float) -> None:
    directory.mkdir(parents=True)
    rows = [{"update": i + 1, "virtual_time": 10.0 * (i + 1), "accuracy": a, "mean_group_js": js,
             "mean_group_latency": latency} for i, a in enumerate(accuracies)]
    (directory / "metrics.json").write_text(json.dumps(rows))
    (directory / "summary.json").write_text(json.dumps({"final_accuracy": accuracies[-1], "target_accuracy": 0.5}))
    (directory / ".hydra").mkdir()
    (directory / ".hydra" / "config.yaml").write_text(
        f"strategy:\n  name: ecofl\ngrouping:\n  lambda: {lam}\n")


def test_sweep_plots_overlay_runs_and_draw_the_lambda_figure(tmp_path):
    for number, lam in enumerate((0.0, 1.0, 4.0)):
        fake_run(tmp_path / f"{number}_grouping.lambda={lam}", lam, [0.2, 0.3, 0.4 + lam / 20, 0.6], 0.5 / (1 + lam),
                 3 + lam)
    written = {p.name for p in plot_sweep(tmp_path)}
    assert written == {"sweep.csv", "sweep_accuracy.png", "sweep_lambda.png"}
    table = (tmp_path / "sweep.csv").read_text().splitlines()
    assert table[0].startswith("run,lambda,mean_group_js,mean_group_latency,late_accuracy")
    # late accuracy: the evaluations at virtual time >= 20 s of a run that ends at 40 s
    assert table[1].startswith("grouping.lambda=0.0,0.0,0.5,3.0,0.4333")
    assert table[3].startswith("grouping.lambda=4.0,4.0,0.1,7.0,0.5")
    assert plot_run(tmp_path / "0_grouping.lambda=0.0").stat().st_size > 0


def test_pipeline_latency_gets_each_pools_sync_round_from_the_planner():
    exp = experiment(composed("latency=pipeline", "homes=60", "dataset=digits"))
    assert "round_s" not in exp.setup.latency
    latency = with_pipeline_rounds(exp).setup.latency
    assert set(latency["round_s"]) == set(latency["pools"])
    assert all(seconds > 0 for seconds in latency["round_s"].values())
    assert latency["local_steps"] == 3 * 3  # 3 epochs of ceil(1437 / 60 / 10) mini-batches
    assert with_pipeline_rounds(experiment(composed())) == experiment(composed())  # paper latency: unchanged


def test_a_sweep_of_strategies_by_partition_gets_a_panel_per_partition(tmp_path):
    """Fig. 8: one accuracy panel per partition, the strategies in each panel's legend."""
    runs = []
    for number, (partition, strategy) in enumerate(
            [(p, s) for p in ("rlg_iid", "rlg_niid") for s in ("ecofl", "fedat", "astraea")]):
        directory = tmp_path / f"{number}_partition={partition},strategy={strategy}"
        fake_run(directory, 1.0, [0.2, 0.5], 0.1, 3.0)
        runs.append(Run.load(directory))
    panels = accuracy_panels(runs)
    assert list(panels) == ["partition=rlg_iid", "partition=rlg_niid"]
    assert [label for label, _ in panels["partition=rlg_niid"]] == ["ecofl", "fedat", "astraea"]
    assert list(accuracy_panels(runs[:3])) == [""]  # strategies alone: one panel
    assert [label for label, _ in accuracy_panels(runs[:3])[""]] == ["ecofl", "fedat", "astraea"]
    assert plot_sweep(tmp_path)


def test_legend_labels_name_only_the_overrides_that_vary(tmp_path):
    """Fig. 7 is run with a shared time limit: the legend says the strategy, not the limit."""
    for number, strategy in enumerate(("ecofl", "fedavg")):
        fake_run(tmp_path / f"{number}_loop.max_virtual_time_s=80,strategy={strategy}", 1.0, [0.2, 0.5], 0.1, 3.0)
    for number, lam in enumerate((0.0, 3.0)):
        fake_run(tmp_path / "lambda" / f"{number}_grouping.lambda={lam},seed=1", lam, [0.2, 0.5], 0.1, 3.0)
    strategies = [Run.load(path) for path in sorted(tmp_path.glob("*_loop*"))]
    lambdas = [Run.load(path) for path in sorted((tmp_path / "lambda").iterdir())]
    assert [label for label, _ in accuracy_panels(strategies)[""]] == ["ecofl", "fedavg"]
    assert [label for label, _ in accuracy_panels(lambdas)[""]] == ["grouping.lambda=0.0", "grouping.lambda=3.0"]


def test_a_sweep_over_seeds_gets_each_settings_mean_and_spread(tmp_path):
    accuracies = {("ecofl", 0): 0.6, ("ecofl", 1): 0.8, ("fedat", 0): 0.3, ("fedat", 1): 0.5}
    for number, ((strategy, seed), late) in enumerate(accuracies.items()):
        fake_run(tmp_path / f"{number}_seed={seed},strategy={strategy}", 1.0, [0.1, late, late], 0.1, 3.0)
    assert "sweep_seeds.csv" in {path.name for path in plot_sweep(tmp_path)}
    runs = [Run.load(path.parent) for path in sorted(tmp_path.glob("*/metrics.json"))]
    table = {row["setting"]: row for row in seed_summary(runs)}
    assert list(table) == ["strategy=ecofl", "strategy=fedat"]
    assert table["strategy=ecofl"]["seeds"] == 2
    assert table["strategy=ecofl"]["late_accuracy_mean"] == pytest.approx(0.7)
    assert table["strategy=fedat"]["final_accuracy_std"] == pytest.approx(np.std([0.3, 0.5], ddof=1))
    assert np.isnan(table["strategy=fedat"]["mean_round_s_mean"])  # rows without round times


def test_a_runs_mean_round_is_from_each_rounds_start_to_its_close(tmp_path):
    fake_run(tmp_path / "0_seed=0,strategy=fedavg", 1.0, [0.1, 0.2], 0.1, 3.0)
    rows = json.loads((tmp_path / "0_seed=0,strategy=fedavg" / "metrics.json").read_text())
    for row, (start, close) in zip(rows, [(0.0, 9.0), (9.0, 12.0)]):
        row.update(round_started_s=start, round_closed_s=close)
    (tmp_path / "0_seed=0,strategy=fedavg" / "metrics.json").write_text(json.dumps(rows))
    assert Run.load(tmp_path / "0_seed=0,strategy=fedavg").mean_round_s() == pytest.approx(6.0)
    plot_sweep(tmp_path)
    with open(tmp_path / "sweep.csv") as handle:
        assert [row["mean_round_s"] for row in csv.DictReader(handle)] == ["6.0"]


def test_runs_of_the_default_seed_join_a_later_seed_sweep_in_the_same_directory(tmp_path):
    """``-m strategy=...`` first, ``-m strategy=... seed=1`` into the same directory later: seed 0 comes from the
    config."""
    for number, strategy in enumerate(("ecofl", "fedat")):
        fake_run(tmp_path / f"{number}_strategy={strategy}", 1.0, [0.1, 0.5, 0.5], 0.1, 3.0)
        with open(tmp_path / f"{number}_strategy={strategy}" / ".hydra" / "config.yaml", "a") as config:
            config.write("seed: 0\n")
        fake_run(tmp_path / f"{number}_seed=1,strategy={strategy}", 1.0, [0.1, 0.7, 0.7], 0.1, 3.0)
    runs = [Run.load(path.parent) for path in sorted(tmp_path.glob("*/metrics.json"))]
    assert list(accuracy_panels(runs)) == ["seed=0", "seed=1"]
    table = {row["setting"]: row for row in seed_summary(runs)}
    assert table["strategy=ecofl"]["seeds"] == 2
    assert table["strategy=ecofl"]["late_accuracy_mean"] == pytest.approx(0.6)


def test_a_partition_that_cannot_give_every_home_data_stops_before_ray_starts(tmp_path):
    from simulations.run import simulate

    exp = experiment({"homes": 2000, "dataset": {"name": "digits"}})  # 1437 training images
    with pytest.raises(UserError, match="2000 homes cannot each get data.*partition.samples_per_client=N"):
        simulate(exp, tmp_path)
    assert not (tmp_path / "timing.json").exists()
    drawn = experiment({"homes": 2000, "dataset": {"name": "digits"}, "partition": {
        "scheme": "shards", "classes_per_client": 2, "samples_per_client": 20}})
    assert drawn.setup.partition["samples_per_client"] == 20


def test_simulation_settings_join_a_cluster_or_start_a_private_instance():
    private = experiment({"simulation": {"actors": 3, "cpus_per_actor": 0.5}}).simulation.backend_config()
    assert private["init_args"]["address"] == "local" and private["init_args"]["num_cpus"] == 2
    assert private["client_resources"] == {"num_cpus": 0.5, "num_gpus": 0.0}
    joined = experiment({"simulation": {"address": "127.0.0.1:6379", "gpus_per_actor": 0.25}}).simulation
    assert joined.backend_config() == {"client_resources": {"num_cpus": 1.0, "num_gpus": 0.25},
                                       "init_args": {"address": "127.0.0.1:6379"}}
    with pytest.raises(UserError, match="silent_homes"):
        experiment({"server": {"silent_homes": "maybe"}})


def test_eq_4s_latency_units_reach_the_loop_from_hydra_and_the_run_config():
    assert experiment(composed()).loop.latency_units == "rt"
    assert experiment(composed("grouping.latency_units=seconds")).loop.latency_units == "seconds"
    assert experiment_from_run_config({"grouping.latency_units": "seconds"}).loop.latency_units == "seconds"
    with pytest.raises(UserError, match="latency_units must be one of rt, seconds"):
        experiment(composed("grouping.latency_units=ms"))


def test_a_null_or_empty_round_deadline_waits_for_every_home_never_the_default():
    """Hydra's null and the run config's "" mean none (documented in conf/config.yaml), not a silent rt."""
    assert experiment(composed("loop.round_deadline=null")).loop.round_deadline == "none"
    assert experiment_from_run_config({"loop.round_deadline": ""}).loop.round_deadline == "none"
    assert experiment({"loop": {"round_deadline": None}}).loop.round_deadline == "none"
    assert experiment({}).loop.round_deadline == "rt"  # left out: the default
    with pytest.raises(UserError, match="round_deadline must be one of rt, none, factor"):
        experiment({"loop": {"round_deadline": "never"}})


@pytest.mark.parametrize("figure", ["fig7", "fig8", "fig9"])
def test_the_figures_run_in_the_papers_conditions_and_the_deadline_is_a_variant(figure):
    paper = experiment(composed(f"+experiment={figure}"))
    assert paper.loop.round_deadline == "none"
    assert paper.loop.max_virtual_time_s == (600 if figure == "fig7" else 300)
    assert experiment(composed(f"+experiment={figure}", "+variant=deadline")).loop.round_deadline == "rt"


def test_training_in_the_background_is_on_by_default_and_can_be_turned_off_from_either_config():
    assert experiment(composed()).server.train_in_background is True
    assert experiment(composed("server.train_in_background=false")).server.train_in_background is False
    assert experiment_from_run_config({"server.train_in_background": False}).server.train_in_background is False
    with pytest.raises(UserError, match="server.train_in_background must be true or false, got 'sometimes'"):
        experiment({"server": {"train_in_background": "sometimes"}})
