"""``ecofl train``: the centralised reference run prints an accuracy that beats chance."""

import json

from ecofl.cli import main


def test_train_on_digits_reports_accuracy_above_chance(capsys):
    assert main(["train", "--dataset", "digits", "--epochs", "2", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["dataset"] == "digits" and summary["train_samples"] == 1437
    assert len(summary["epochs"]) == 2
    assert summary["accuracy"] > 0.5  # ten classes: chance is 0.1


def test_unknown_model_is_one_line_error(capsys):
    assert main(["train", "--dataset", "digits", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'nope'" in err and "'cnn'" in err and err.count("\n") == 1 and "Traceback" not in err
