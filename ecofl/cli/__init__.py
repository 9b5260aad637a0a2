"""The ``ecofl`` command line: one sub-command per module in this package.

Each module has ``register(subparsers)`` which adds its sub-command and sets
``func`` (taking the parsed arguments, returning an exit code). User errors
are raised as :class:`ecofl.errors.UserError` and printed without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ecofl.errors import UserError
from ecofl.interrupt import INTERRUPTED_EXIT, sigterm_as_interrupt

# Sub-command modules, in the order ``ecofl --help`` lists them.
COMMAND_MODULES = ("data", "train", "plan", "home", "device")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ecofl", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"ecofl.cli.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"ecofl.cli.{name}":
                continue  # that part of the platform is not installed yet
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with sigterm_as_interrupt():  # `kill` stops a run as Ctrl-C does: its workers and namespaces are cleaned up
            return int(args.func(args) or 0)
    except UserError as error:
        print(f"ecofl: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupted:  # Ctrl-C or SIGTERM, after every `with` block has cleaned up
        print(f"ecofl: interrupted{f' ({interrupted})' if str(interrupted) else ''}", file=sys.stderr)
        return INTERRUPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
