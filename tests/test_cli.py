"""The ``ecofl`` command's dispatch: every command is there, and each imports only what it needs."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from ecofl.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def choices(parser: argparse.ArgumentParser, *words: str) -> set[str]:
    """The sub-command names of ``parser`` under the command ``words``."""
    for word in words:
        parser = subcommands(parser).choices[word]
    return set(subcommands(parser).choices)


def subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def test_help_lists_every_command_and_the_home_and_device_groups():
    parser = build_parser([])
    assert choices(parser) == {"data", "train", "plan", "home", "device"}
    assert choices(parser, "home") == {"train", "infer", "serve", "status"}
    assert choices(parser, "device") == {"serve"}
    assert {path[0] for path in COMMANDS} == choices(parser)


def test_a_command_builds_only_its_own_parser_and_an_unknown_one_lists_them_all(capsys):
    assert choices(build_parser(["home", "status", "--home", "x"]), "home") == {"status"}
    assert choices(build_parser(["home"]), "home") == {"train", "infer", "serve", "status"}
    with pytest.raises(SystemExit):
        build_parser(["hmoe"]).parse_args(["hmoe"])
    assert "choose from 'data', 'train', 'plan', 'home', 'device'" in capsys.readouterr().err


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
