"""The ``ecofl`` command line: one module in this package per command.

Every command's options are in :mod:`ecofl.cli.options`, which imports no
torch, so parsing and ``--help`` answer at once; the module that runs a
command (``run(args)``, returning an exit code) is imported only when the
command runs: the training commands need torch and take seconds to import.
User errors are raised as :class:`ecofl.errors.UserError` and printed
without a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import os
import signal
import sys
from collections.abc import Callable

from ecofl.cli import options
from ecofl.errors import UserError
from ecofl.interrupt import INTERRUPTED_EXIT, end_at, sigterm_as_interrupt

# Command words -> the function of ecofl.cli.options that adds its parser, in the order ``ecofl --help`` lists them.
COMMANDS: dict[tuple[str, ...], Callable[[argparse._SubParsersAction], None]] = {
    ("data",): options.add_data_commands,
    ("train",): options.add_train,
    ("plan",): options.add_plan,
    ("home", "train"): options.add_home_train,
    ("home", "infer"): options.add_home_infer,
    ("home", "serve"): options.add_home_serve,
    ("home", "status"): options.add_home_status,
    ("device", "serve"): options.add_device_serve,
}
DESCRIPTION = ("Eco-FL's homes: inspect data, plan a model over a home's devices, train through its pipeline, "
               "serve a deployed home (docs/pipeline.md, docs/deploy.md); simulations: python -m simulations.run")
GROUPS = {
    "home": "run a home's pipeline (emulated devices), or serve a deployed home",
    "device": "serve as one device of a home (deployment)",
}


class UsageError(UserError):
    """A command line argparse rejects: said in one line (with ``--help`` for the rest), not with the usage."""


class Parser(argparse.ArgumentParser):
    """argparse's parser whose errors are :class:`UsageError` (its subcommands' parsers are Parsers too)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = Parser(prog="ecofl", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, add in COMMANDS.items():
        subparsers = commands
        if len(path) == 2:
            if path[0] not in groups:
                group = commands.add_parser(path[0], help=GROUPS[path[0]])
                groups[path[0]] = group.add_subparsers(dest=f"{path[0]}_command", required=True)
            subparsers = groups[path[0]]
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
        with sigterm_as_interrupt():  # `kill` stops a run as Ctrl-C does: its workers and namespaces are cleaned up
            command = importlib.import_module(f"ecofl.cli.{args.command_module}")
            return int(getattr(command, args.command_function)(args) or 0)
    except UserError as error:
        print(f"ecofl: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:  # Ctrl-C or SIGTERM, after every `with` block has cleaned up
        print(f"ecofl: interrupted{f' ({interrupted})' if str(interrupted) else ''}", file=sys.stderr)
        return INTERRUPTED_EXIT


def run() -> None:
    """The ``ecofl`` program: :func:`main` (which turns SIGTERM into Ctrl-C while it runs), its exit status.

    Before it and after it, SIGTERM (and Ctrl-C once interrupted) ends the program with the interrupted status:
    a second signal during the exit of a stopped run (a user pressing Ctrl-C twice) does not change it. A stopped
    run runs its exit handlers (the fork server's close among them) with those handlers in place, then ends at
    once: the interpreter's own exit resets signal handlers to the default late in its finalization, and a
    second signal there would end the program as killed by it."""
    end_at(signal.SIGTERM)
    code = main()
    if code == INTERRUPTED_EXIT:
        end_at(signal.SIGINT)
        atexit._run_exitfuncs()  # what sys.exit would run first; CPython has no public name for it
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
