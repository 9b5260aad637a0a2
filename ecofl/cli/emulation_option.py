"""``--emulate cgroup|sleep|none``: how a command's devices are emulated on this machine (docs/pipeline.md)."""

from __future__ import annotations

import argparse
import sys

from ecofl.pipeline.runtime.emulation import Emulation, default_emulation


def add_emulation_argument(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--emulate", choices=[str(mode) for mode in Emulation], default=None,
                       help="cgroup: each device confined to its cores and memory, every time real; sleep: devices "
                            "sleep to the cost model's time (the model's figures); none: host speed. Default: cgroup "
                            "where cgroups are writable, else sleep")
    modes.add_argument("--no-emulate", dest="emulate", action="store_const", const=str(Emulation.NONE),
                       help="the same as --emulate none")


def chosen_emulation(args: argparse.Namespace) -> Emulation:
    """The mode asked for; without one, the machine's default, said in one line on stderr."""
    if args.emulate is not None:
        return Emulation.parse(args.emulate)
    mode, line = default_emulation()
    print(line, file=sys.stderr)
    return mode
