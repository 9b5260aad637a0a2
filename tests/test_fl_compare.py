"""Strategies compared over seeds: time to accuracy and mean curves (simulations/compare.py), on hand-made runs."""

import csv
import gzip
import json
import warnings

import numpy as np
import pytest
from PIL import Image

from simulations.before_after import early_closes
from simulations.before_after import main as before_after_main
from simulations.compare import (accuracy_at, main, setting_label, settings_of, time_to_accuracy,
                                 time_to_accuracy_table)
from simulations.lambda_table import main as lambda_table_main
from simulations.plot import Run, over_lambda, plot_lambda


def fake_run(directory, curve):
    """A run directory whose evaluations are ``curve``: (virtual time, accuracy) pairs."""
    directory.mkdir(parents=True)
    rows = [{"update": i + 1, "virtual_time": t, "accuracy": a} for i, (t, a) in enumerate(curve)]
    rows.insert(1, {"update": 0, "virtual_time": curve[0][0] + 0.1, "accuracy": None})  # an update not evaluated
    (directory / "metrics.json").write_text(json.dumps(rows))
    (directory / "summary.json").write_text(json.dumps({"target_accuracy": 0.7}))
    return Run.load(directory)


CURVES = {
    ("ecofl", 0): [(5, 0.5), (10, 0.65), (15, 0.72)],
    ("ecofl", 1): [(5, 0.55), (10, 0.61), (15, 0.69)],
    ("fedat", 0): [(5, 0.4), (10, 0.5), (15, 0.62)],
    ("fedat", 1): [(5, 0.3), (10, 0.45), (15, 0.58)],
}


@pytest.fixture
def sweep(tmp_path):
    for number, ((strategy, seed), curve) in enumerate(CURVES.items()):
        fake_run(tmp_path / f"{number}_seed={seed},strategy={strategy}", curve)
    return tmp_path


def test_time_to_accuracy_is_the_first_evaluation_at_or_above_the_target(sweep):
    run = Run.load(sweep / "0_seed=0,strategy=ecofl")
    assert time_to_accuracy(run, 0.6) == 10.0 and time_to_accuracy(run, 0.72) == 15.0
    assert time_to_accuracy(run, 0.8) is None
    np.testing.assert_allclose(accuracy_at(run, np.array([1.0, 5.0, 12.0, 40.0])), [np.nan, 0.5, 0.65, 0.72])


def test_the_table_averages_the_seeds_that_reach_a_target_and_divides_by_eco_fls_mean(sweep):
    runs = [Run.load(path.parent) for path in sorted(sweep.glob("*/metrics.json"))]
    settings = settings_of(runs)
    assert list(settings) == ["strategy=ecofl", "strategy=fedat"]
    rows = {(r["strategy"], r["target"]): r for r in time_to_accuracy_table(settings, [0.6, 0.7])}
    assert rows[("ecofl", 0.6)]["mean_s"] == 10.0 and rows[("ecofl", 0.6)]["reached"] == 2
    assert rows[("fedat", 0.6)]["mean_s"] == 15.0 and rows[("fedat", 0.6)]["reached"] == 1
    assert rows[("fedat", 0.6)]["per_seed_s"] == "15.0;-"
    assert rows[("fedat", 0.6)]["ratio_to_ecofl"] == pytest.approx(1.5)
    assert rows[("ecofl", 0.7)]["reached"] == 1 and rows[("fedat", 0.7)]["mean_s"] is None
    assert rows[("fedat", 0.7)]["ratio_to_ecofl"] is None


def test_the_command_writes_the_table_and_the_curves(sweep, tmp_path, capsys):
    main([str(sweep), "--targets", "0.6", "--out", str(tmp_path / "fig")])
    with open(tmp_path / "fig_time_to_accuracy.csv") as handle:
        assert [row["strategy"] for row in csv.DictReader(handle)] == ["ecofl", "fedat"]
    assert (tmp_path / "fig_curves.png").stat().st_size > 0
    assert "| FedAT | 60% | 1 of 2 | 15.0 | 15.0;- | 1.50 |" in capsys.readouterr().out


def test_the_command_compares_several_sweeps_as_one(sweep, tmp_path, capsys):
    """An ablation's runs beside the figure's: one table, its ratio to Eco-FL's mean from the other directory."""
    fake_run(tmp_path / "ablation" / "0_seed=0,strategy=fedat_equal_weights", [(5, 0.5), (20, 0.6)])
    main([str(sweep), str(tmp_path / "ablation"), "--targets", "0.6", "--out", str(tmp_path / "fig")])
    assert "| FedAT (equal tier weights) | 60% | 1 of 1 | 20.0 | 20.0 | 2.00 |" in capsys.readouterr().out
    main([str(sweep), str(sweep), "--targets", "0.6", "--out", str(tmp_path / "fig")])  # a directory given twice
    assert "| FedAT | 60% | 1 of 2 | 15.0 | 15.0;- | 1.50 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no runs"):
        main([str(sweep), str(tmp_path / "missing"), "--out", str(tmp_path / "fig")])


def test_a_run_archived_with_its_rows_gzipped_reads_and_compares_as_written(sweep, tmp_path, capsys):
    """scripts/rerun_figures.sh gzips a long run's metrics.json (no file in git over 2 MiB)."""
    main([str(sweep), "--targets", "0.6", "--out", str(tmp_path / "plain")])
    plain = capsys.readouterr().out
    run = next(sweep.glob("*strategy=fedat"))
    rows = Run.load(run).rows
    with gzip.open(run / "metrics.json.gz", "wt") as packed:
        json.dump(rows, packed)
    (run / "metrics.json").unlink()
    assert Run.load(run).rows == rows
    main([str(sweep), "--targets", "0.6", "--out", str(tmp_path / "gzipped")])
    assert capsys.readouterr().out == plain.replace("plain", "gzipped")


def test_a_sweep_over_partitions_names_each_row_by_strategy_and_partition(tmp_path, capsys):
    """Fig. 8: strategy x partition; a table row names both, the curves get one panel per partition, and the
    first evaluation coming after the grid's first point makes no empty mean."""
    curves = {("iid", "ecofl"): [(12, 0.5), (20, 0.65)], ("iid", "fedat"): [(12, 0.5), (40, 0.65)],
              ("niid", "ecofl"): [(5, 0.5), (10, 0.65)], ("niid", "fedat"): [(12, 0.5), (20, 0.65)]}
    for number, ((partition, strategy), curve) in enumerate(curves.items()):
        fake_run(tmp_path / "sweep" / f"{number}_partition={partition},seed=0,strategy={strategy}", curve)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        main([str(tmp_path / "sweep"), "--targets", "0.6", "--out", str(tmp_path / "fig")])
    out = capsys.readouterr().out
    assert "| FedAT, partition=iid | 60% | 1 of 1 | 40.0 | 40.0 | 2.00 |" in out  # against Eco-FL on iid
    assert "| FedAT, partition=niid | 60% | 1 of 1 | 20.0 | 20.0 | 2.00 |" in out  # ... and on niid
    assert setting_label("partition=niid,strategy=fedat", "fedat") == "FedAT, partition=niid"
    assert setting_label("run_7", None) == "run_7"
    width, height = Image.open(tmp_path / "fig_curves.png").size
    assert width > 1.8 * height  # two panels side by side


def test_a_sweep_that_keeps_the_strategy_names_it_from_the_config_and_gives_no_ratio_between_strategies(
        tmp_path, capsys):
    """Fig. 9: lambda varies, the strategy is the config's (a config group: its option's name)."""
    for number, lam in enumerate([0, 30]):
        run = tmp_path / "sweep" / f"{number}_grouping.lambda={lam},seed=0"
        fake_run(run, [(5, 0.5), (10, 0.65 if lam else 0.55)])
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text("strategy:\n  name: ecofl\n  mu: 0.05\nseed: 0\n")
    assert Run.load(tmp_path / "sweep" / "0_grouping.lambda=0,seed=0").setting("strategy") == "ecofl"
    main([str(tmp_path / "sweep"), "--targets", "0.6", "--out", str(tmp_path / "fig")])
    out = capsys.readouterr().out
    assert "| Eco-FL, grouping.lambda=30 | 60% | 1 of 1 | 10.0 | 10.0 | - |" in out
    assert "| Eco-FL, grouping.lambda=0 | 60% | 0 of 1 | - | - | - |" in out
    width, height = Image.open(tmp_path / "fig_curves.png").size
    assert width < 1.8 * height  # the lambdas are lines of one panel


def test_fig9_averages_each_lambdas_seeds_into_one_point(tmp_path):
    """Fig. 9 over seeds: one point per lambda, the mean of its seeds, with their lowest and highest."""
    runs = []
    for number, (lam, seed, js) in enumerate([(0, 0, 0.5), (30, 0, 0.1), (0, 1, 0.7), (30, 1, 0.3), (3, 0, 0.2)]):
        directory = tmp_path / f"{number}_grouping.lambda={lam},seed={seed}"
        (directory / ".hydra").mkdir(parents=True)
        (directory / ".hydra" / "config.yaml").write_text(f"grouping:\n  lambda: {lam}\n")
        (directory / "metrics.json").write_text(json.dumps([{"virtual_time": 1.0, "accuracy": 0.5,
                                                             "mean_group_js": js}]))
        (directory / "summary.json").write_text("{}")
        runs.append(Run.load(directory))
    lambdas, means, lows, highs = over_lambda(runs, lambda run: run.mean_of("mean_group_js"))
    assert lambdas == [0.0, 3.0, 30.0]
    np.testing.assert_allclose(means, [0.6, 0.2, 0.2])
    np.testing.assert_allclose(lows, [0.5, 0.2, 0.1])
    np.testing.assert_allclose(highs, [0.7, 0.2, 0.3])
    assert plot_lambda(runs, tmp_path / "sweep_lambda.png").stat().st_size > 0


def timed_run(directory, summary, rows):
    """A run directory with the given metric rows and summary."""
    directory.mkdir(parents=True)
    (directory / "metrics.json").write_text(json.dumps(rows))
    (directory / "summary.json").write_text(json.dumps(summary))
    return directory


def test_before_after_compares_the_seeds_both_ran_and_counts_late_rounds_closed_before_their_deadline(tmp_path,
                                                                                                        capsys):
    summary = {"updates": 2, "stragglers_total": 1}
    untimed = [{"virtual_time": 8.0, "accuracy": 0.5, "stragglers": 1}, {"virtual_time": 16.0, "accuracy": 0.7}]
    on_time = {"virtual_time": 9.0, "accuracy": 0.6, "stragglers": 0, "round_closed_s": 9.0, "deadline_s": 10.0}
    at_deadline = {"virtual_time": 10.0, "accuracy": 0.65, "stragglers": 1, "round_closed_s": 10.0, "deadline_s": 10.0}
    early = {"virtual_time": 18.0, "accuracy": 0.7, "stragglers": 2, "round_closed_s": 18.0, "deadline_s": 20.0}
    timed_run(tmp_path / "old" / "0_seed=0,strategy=fedavg", summary, untimed)
    timed_run(tmp_path / "new" / "0_seed=0,strategy=fedavg", summary, [at_deadline, early])
    timed_run(tmp_path / "new" / "1_seed=1,strategy=fedavg", {"updates": 9, "stragglers_total": 9}, [on_time])
    timed_run(tmp_path / "new" / "2_seed=0,strategy=fedat", summary, [on_time])
    assert early_closes(Run.load(tmp_path / "new" / "0_seed=0,strategy=fedavg")) == (2, 1)
    assert early_closes(Run.load(tmp_path / "old" / "0_seed=0,strategy=fedavg")) is None
    before_after_main([str(tmp_path / "old"), str(tmp_path / "new"), "--targets", "0.7",
                       "--out", str(tmp_path / "fig")])
    out, err = capsys.readouterr()
    # FedAvg over seed 0 only (the old sweep has no seed 1); late accuracy, the mean of the evaluations at or
    # after half the last one's time: before (0.5 + 0.7) / 2, after (0.65 + 0.7) / 2; 70% at 16 s, then 18 s
    assert "| FedAvg | 1 | 0.600 → 0.675 | 16.0 (1/1) → 18.0 (1/1) | 2 → 2 | 1 → 1 | - → 1 of 2 |" in out
    assert "| FedAT | 1 | - → 0.600 | - → - (0/1) | - → 2 | - → 1 | - → 0 of 0 |" in out
    assert "unmatched setting: strategy=fedat (after only)" in err
    with open(tmp_path / "fig_before_after.csv") as handle:
        rows = {row["strategy"]: row for row in csv.DictReader(handle)}
    assert rows["fedavg"]["after_early_closes"] == "1" and rows["fedat"]["before_seeds"] == ""


def lambda_run(sweep, number, lam, seed, rows):
    """A Fig. 9 run directory: ``grouping.lambda`` and ``seed`` in its name and config, ``rows`` its metrics."""
    directory = sweep / f"{number}_grouping.lambda={lam},seed={seed}"
    (directory / ".hydra").mkdir(parents=True)
    (directory / ".hydra" / "config.yaml").write_text(f"grouping:\n  lambda: {lam}\nseed: {seed}\n")
    (directory / "metrics.json").write_text(json.dumps(rows))
    (directory / "summary.json").write_text("{}")
    return directory


def test_the_lambda_table_averages_each_lambdas_seeds_and_says_which_seeds_lack_round_times(tmp_path, capsys):
    """Fig. 9's table (simulations/lambda_table.py): one row per lambda, numerically ascending, seeds numerically
    ordered; group JS is each run's mean, then the mean over seeds; final is the last evaluation, best the highest."""
    runs = {  # (lambda, seed): (group JS per row, group latency, round s or None, late-half accuracies, updates)
        (10, 10): ([0.2], 8.0, 6.0, [0.6, 0.5], 100), (10, 2): ([0.4, 0.4, 0.1], 6.0, None, [0.3, 0.4], 120),
        (10, 3): ([0.3], 7.0, 5.0, [0.4, 0.4], 110), (3, 0): ([0.5], 5.0, 4.0, [0.2, 0.2], 130)}
    for number, ((lam, seed), (js, latency, round_s, late, updates)) in enumerate(runs.items()):
        rows = [{"virtual_time": 10.0, "accuracy": 0.1, "mean_group_js": value, "mean_group_latency": latency}
                for value in js]
        rows += [{"virtual_time": 20.0 + 10 * i, "accuracy": a} for i, a in enumerate(late)]
        rows += [{"virtual_time": 60.0, "accuracy": None}] * (updates - len(rows))  # updates not evaluated
        if round_s is not None:
            rows[0].update(round_started_s=1.0, round_closed_s=1.0 + round_s)
        lambda_run(tmp_path / "sweep", number, lam, seed, rows)
    lambda_table_main([str(tmp_path / "sweep"), "--targets", "0.5", "--out", str(tmp_path / "fig9")])
    out = capsys.readouterr().out
    # lambda 10: JS (0.3 + 0.2 + 0.3) / 3; seeds 2, 3, 10 in that order; seed 2 has no round times; final
    # (0.4 + 0.4 + 0.5) / 3, best (0.4 + 0.4 + 0.6) / 3; one seed reaches 0.5, at 20 s
    row_10 = ("| 10 | 0.267 | 7.00 | 5.50 (2 seeds) | 110 | 0.433 ± 0.104 | 2: 0.350, 3: 0.400, 10: 0.550 | 0.433 "
              "| 0.467 | 1 of 3, 20.0 |")
    row_3 = "| 3 | 0.500 | 5.00 | 4.00 | 130 | 0.200 | 0: 0.200 | 0.200 | 0.200 | 0 of 1 |"
    assert out.index(row_3) < out.index(row_10)
    assert (tmp_path / "fig9_lambda_table.md").read_text().splitlines()[2:] == [row_3, row_10]


def test_the_lambda_table_refuses_runs_it_cannot_place(sweep, tmp_path, capsys):
    """A run without lambda, without an integer seed, or a second run of one lambda and seed: a clear exit (a run
    whose name alone gives them is placed)."""
    with pytest.raises(SystemExit, match="no grouping.lambda"):
        lambda_table_main([str(sweep)])
    rows = [{"virtual_time": 5.0, "accuracy": 0.5}]
    lambda_run(tmp_path / "two", 0, 3, 1, rows)
    lambda_run(tmp_path / "two", 1, 3, 1, rows)
    with pytest.raises(SystemExit, match="two runs of lambda 3, seed 1"):
        lambda_table_main([str(tmp_path / "two")])
    lambda_run(tmp_path / "unseeded", 0, 3, "null", rows)
    with pytest.raises(SystemExit, match="no integer seed"):
        lambda_table_main([str(tmp_path / "unseeded")])
    overrides_only = lambda_run(tmp_path / "named", 0, 10, 4, rows)  # lambda and seed from the run's name alone
    (overrides_only / ".hydra" / "config.yaml").unlink()
    assert Run.load(overrides_only).grouping_lambda() == 10.0  # as plot.py's Fig. 9 figure reads it too
    lambda_table_main([str(tmp_path / "named"), "--targets", "0.5"])
    assert "| 10 | - | - | - | 1 | 0.500 | 4: 0.500 | 0.500 | 0.500 | 1 of 1, 5.0 |" in capsys.readouterr().out


def test_the_lambda_table_cuts_runs_at_a_virtual_second_and_keeps_the_seeds_asked_for(tmp_path, capsys):
    """--until S: the updates and evaluations up to S; --seeds: only those; a run left with no evaluation: "-"."""
    for number, seed in enumerate([0, 1]):
        lambda_run(tmp_path / "sweep", number, 3, seed,
                   [{"virtual_time": t, "accuracy": a, "mean_group_js": 0.1, "mean_group_latency": 8.0}
                    for t, a in [(10.0, 0.2 + seed / 10), (20.0, 0.6), (30.0, None), (40.0, 0.4)]])
    lambda_table_main([str(tmp_path / "sweep"), "--targets", "0.5", "--until", "30", "--seeds", "0"])
    # seed 0 up to 30 s: 3 updates, evaluations 0.2 (10 s) and 0.6 (20 s); the second half (>= 10 s) holds both
    assert "| 3 | 0.100 | 8.00 | - | 3 | 0.400 | 0: 0.400 | 0.600 | 0.600 | 1 of 1, 20.0 |" in capsys.readouterr().out
    lambda_table_main([str(tmp_path / "sweep"), "--targets", "0.5", "--until", "5"])
    assert "| 3 | - | - | - | 0 | - | 0: -, 1: - | - | - | 0 of 2 |" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no runs of seed 7"):
        lambda_table_main([str(tmp_path / "sweep"), "--seeds", "0", "7"])


def test_claims_set_two_conditions_side_by_side_cut_to_one_horizon(sweep, tmp_path, capsys):
    """simulations.claims: per condition and strategy, time to target (x Eco-FL), late accuracy, stragglers."""
    from simulations.claims import condition_rows, main as claims_main

    runs = [Run.load(path.parent) for path in sorted(sweep.glob("*/metrics.json"))]
    rows = {r["strategy"]: r for r in condition_rows("paper", runs, [0.6])}
    assert rows["fedat"]["t0.6"] == (15.0, 1, pytest.approx(1.5))
    assert rows["ecofl"]["late_mean"] == pytest.approx(np.mean([(0.65 + 0.72) / 2, (0.61 + 0.69) / 2]))
    assert rows["ecofl"]["updates"] == 4 and rows["ecofl"]["stragglers"] == 0
    claims_main([f"paper={sweep}", f"cut={sweep}", "--until", "10", "--targets", "0.6", "0.7"])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| condition | strategy | to 60%")
    cut_fedat = next(line for line in table if line.startswith("| cut | FedAT"))
    assert "| - | - |" in cut_fedat  # cut at 10 s, FedAT reaches neither 60% nor 70%
    claims_main([f"seed0={sweep}", "--seeds", "0", "--targets", "0.6"])  # a one-seed ablation's baseline
    assert all("(1/1" in line or "| - |" in line for line in capsys.readouterr().out.splitlines()[2:])
    with pytest.raises(SystemExit):
        claims_main([f"seed7={sweep}", "--seeds", "7"])
