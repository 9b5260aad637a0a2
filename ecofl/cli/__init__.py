"""The ``ecofl`` command line: one module in this package per command.

Each module has ``register(subparsers)`` which adds its command's parser and
sets ``func`` (taking the parsed arguments, returning an exit code). User
errors are raised as :class:`ecofl.errors.UserError` and printed without a
traceback.

A command's module is imported only when that command is asked for (all of
them for ``ecofl --help``): the training commands need torch and take seconds
to import, while ``ecofl home status`` must answer at once.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Sequence

from ecofl.errors import UserError
from ecofl.interrupt import INTERRUPTED_EXIT, end_at, sigterm_as_interrupt

# Command words -> the module in this package that registers it, in the order ``ecofl --help`` lists them.
COMMANDS: dict[tuple[str, ...], str] = {
    ("data",): "data",
    ("train",): "train",
    ("plan",): "plan",
    ("home", "train"): "home_train",
    ("home", "infer"): "home_infer",
    ("home", "serve"): "home_serve",
    ("home", "status"): "home_status",
    ("device", "serve"): "device_serve",
}
GROUPS = {
    "home": "run a home's pipeline (emulated devices), or serve a deployed home",
    "device": "serve as one device of a home (deployment)",
}


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of the commands ``argv`` may name (every command when it names none we know)."""
    words = _leading_words(argv)
    asked = [path for path in COMMANDS if all(a == b for a, b in zip(path, words))] or list(COMMANDS)
    parser = argparse.ArgumentParser(prog="ecofl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for path in asked:
        subparsers = commands
        if len(path) == 2:
            if path[0] not in groups:
                group = commands.add_parser(path[0], help=GROUPS[path[0]])
                groups[path[0]] = group.add_subparsers(dest=f"{path[0]}_command", required=True)
            subparsers = groups[path[0]]
        importlib.import_module(f"ecofl.cli.{COMMANDS[path]}").register(subparsers)
    return parser


def _leading_words(argv: Sequence[str]) -> list[str]:
    """The command words: the arguments before the first option."""
    words = []
    for arg in argv:
        if arg.startswith("-"):
            break
        words.append(arg)
    return words


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        with sigterm_as_interrupt():  # `kill` stops a run as Ctrl-C does: its workers and namespaces are cleaned up
            return int(args.func(args) or 0)
    except UserError as error:
        print(f"ecofl: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:  # Ctrl-C or SIGTERM, after every `with` block has cleaned up
        print(f"ecofl: interrupted{f' ({interrupted})' if str(interrupted) else ''}", file=sys.stderr)
        return INTERRUPTED_EXIT


def run() -> None:
    """The ``ecofl`` program: :func:`main` (which turns SIGTERM into Ctrl-C while it runs), its exit status.

    Before it and after it, SIGTERM (and Ctrl-C once interrupted) ends the program with the interrupted status:
    a second signal during the exit of a stopped run (a user pressing Ctrl-C twice) does not change it."""
    end_at(signal.SIGTERM)
    code = main()
    if code == INTERRUPTED_EXIT:
        end_at(signal.SIGINT)
    sys.exit(code)


if __name__ == "__main__":
    run()
