"""The ``ecofl`` command's dispatch: every command is there, help needs no torch, and each imports what it needs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from ecofl.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def choices(parser: argparse.ArgumentParser, *words: str) -> set[str]:
    """The sub-command names of ``parser`` under the command ``words``."""
    for word in words:
        parser = subcommands(parser).choices[word]
    return set(subcommands(parser).choices)


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_help_lists_every_command_and_the_home_and_device_groups():
    parser = build_parser()
    assert choices(parser) == {"data", "train", "plan", "home", "device"}
    assert choices(parser, "home") == {"train", "infer", "serve", "status"}
    assert choices(parser, "device") == {"serve"}
    assert {path[0] for path in COMMANDS} == choices(parser)


def test_an_unknown_command_or_a_bad_option_is_one_line_naming_the_choices(capsys):
    assert main(["hmoe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "choose from 'data', 'train', 'plan', 'home', 'device'" in err
    assert main(["home", "train", "--model", "cnn", "--pool", "ecofl-3stage", "--dataset", "imagenet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'digits', 'fashion_mnist', 'mnist', 'cifar10'" in err


def test_an_injected_event_at_a_device_the_home_lacks_is_refused_before_anything_runs(capsys):
    assert main(["home", "train", "--model", "cnn", "--pool", "ecofl-3stage", "--dataset", "digits", "--rounds", "2",
                 "--emulate", "sleep", "--inject", "kill:7@1"]) == 2
    assert "kill:7@1 names device 7: the home's devices are 0-2" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["--help"], ["home", "train", "--help"], ["plan", "--help"],
                                     ["home", "infer", "--help"], ["data", "partition", "--help"]])
def test_help_imports_no_torch(command):
    """`python -X importtime -m ecofl ... --help` names no torch module: help answers in well under a second."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "ecofl", *command], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and "usage: ecofl" in out.stdout, out.stderr[-2000:]
    imported = [line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert imported and not [m for m in imported if m.split(".")[0] == "torch"]


def test_every_option_has_help_and_name_options_list_the_valid_names():
    from ecofl import names
    from ecofl.pools import pool_names

    def parsers(parser):
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    for parser in parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{parser.prog} {action.option_strings[0]} has no help"
    home_train = subcommands(subcommands(build_parser()).choices["home"]).choices["train"]
    helps = {action.dest: action.help for action in home_train._actions}
    assert all(name in helps["model"] for name in names.MODELS)
    assert all(name in helps["pool"] for name in pool_names()) and "mixed-rpi" in helps["pool"]
    assert all(name in helps["planner"] for name in names.PLANNERS)


def test_the_names_help_lists_are_the_ones_implemented():
    """ecofl.names lists exactly what the model zoo, the planners and the emulation modes implement."""
    from ecofl import names
    from ecofl.models.registry import _BUILDERS
    from ecofl.pipeline.planners import PLANNERS
    from ecofl.pipeline.runtime.emulation import Emulation

    assert tuple(_BUILDERS) == names.MODELS
    assert tuple(PLANNERS) == names.PLANNERS
    # the modes of devices emulated on this machine; a deployed home's (real) is not one
    assert tuple(str(mode) for mode in Emulation if mode != Emulation.REAL) == names.EMULATION_MODES


def test_missing_data_advice_names_only_options_the_command_has(capsys):
    """`ecofl home train --dataset mnist` without the files: the advice names --download and --data-root, which
    `ecofl home train --help` lists (it once named --root, which the command did not have)."""
    assert main(["home", "train", "--model", "cnn", "--pool", "ecofl-3stage", "--dataset", "mnist", "--rounds", "1",
                 "--data-root", "/nonexistent/ecofl-data"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "mnist: data files not found" in err and "Traceback" not in err
    home_train = subcommands(subcommands(build_parser()).choices["home"]).choices["train"]
    listed = {option for action in home_train._actions for option in action.option_strings}
    advised = {word.rstrip(";,") for word in err.split() if word.startswith("--")}
    assert advised and advised <= listed, advised - listed


def test_home_status_imports_neither_torch_nor_the_pipeline(tmp_path):
    """`ecofl home status` must answer within 2 s under attack (issue 25): its imports once took 4 s alone."""
    secret = tmp_path / "secret"
    secret.write_text("ab" * 32)
    secret.chmod(0o600)
    probe = ("import sys; from ecofl.cli import main; "
             f"code = main(['home', 'status', '--home', '127.0.0.1:1', '--secret-file', {str(secret)!r}]); "
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('ecofl.pipeline')); "
             "print(code, heavy)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "2 []", out.stdout + out.stderr[-2000:]  # refused (nobody there), nothing heavy
    assert "no home service at 127.0.0.1:1" in out.stderr


def test_the_readme_names_every_built_in_pool():
    from ecofl.pools import pool_names

    readme = (ROOT / "README.md").read_text()
    assert [name for name in pool_names() if f"`{name}`" not in readme] == []
