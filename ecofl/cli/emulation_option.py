"""``--emulate cgroup|sleep|none`` (ecofl.cli.options): how a command's devices are emulated here (docs/pipeline.md)."""

from __future__ import annotations

import argparse
import sys

from ecofl.pipeline.runtime.emulation import Emulation, default_emulation


def chosen_emulation(args: argparse.Namespace) -> Emulation:
    """The mode asked for; without one, the machine's default, said in one line on stderr."""
    if args.emulate is not None:
        return Emulation.parse(args.emulate)
    mode, line = default_emulation()
    print(line, file=sys.stderr)
    return mode
