"""Every ``ecofl`` command's options, importable without torch: ``ecofl --help`` answers at once.

Each ``add_*`` function adds one command's parser and names the module of
this package that runs it (``command`` and its ``run`` function, imported
only when the command runs). Options that take a name list the valid ones
(:mod:`ecofl.names`, :func:`ecofl.pools.pool_names`).
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable
from pathlib import Path

from ecofl import names
from ecofl.pools import pool_names

SECRET_HELP = "the home's secret (hex); default $ECOFL_HOME_SECRET_FILE or $ECOFL_HOME_SECRET"
PROFILE_CACHE_HELP = "profile cache (default ~/.cache/ecofl/profiles)"


def runs(parser: argparse.ArgumentParser, module: str, function: str = "run") -> None:
    """The command ``parser`` parses is run by ``ecofl.cli.<module>.<function>(args)``."""
    parser.set_defaults(command_module=module, command_function=function)


def one_of(choices: tuple[str, ...] | list[str]) -> str:
    return "one of " + ", ".join(choices)


def add_model(parser: argparse.ArgumentParser, **kwargs) -> None:
    parser.add_argument("--model", metavar="NAME", choices=names.MODELS, help=one_of(names.MODELS), **kwargs)


def add_pool(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pool", required=True, metavar="POOL",
                        help=f"{one_of(pool_names())}; or a pool file (YAML, docs/examples/my-home.yaml); "
                             "or device presets a,b,c")


def add_planner(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--planner", default=default, choices=names.PLANNERS, metavar="NAME",
                        help=f"{one_of(names.PLANNERS)} (default {default})")


def add_granularity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--granularity", default="block", choices=names.GRANULARITIES,
                        help="where the planner may cut the model: between blocks, or inside them (default block)")


def add_data(parser: argparse.ArgumentParser, required: bool = True, help_suffix: str = "") -> None:
    """``--dataset`` and where its files come from: ``--data-root`` and ``--download``."""
    parser.add_argument("--dataset", required=required, default=None if required else "fashion_mnist",
                        choices=names.DATASETS, metavar="NAME", help=one_of(names.DATASETS) + help_suffix)
    add_data_source(parser)


def add_data_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-root", "--root", dest="data_root", metavar="DIR", default=None,
                        help="the dataset's files in torchvision layout (DIR/MNIST/raw, ...)")
    parser.add_argument("--download", action="store_true", help="download missing files (needs the internet)")


def add_emulation(parser: argparse.ArgumentParser, default: str | None = None, help_text: str | None = None) -> None:
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--emulate", choices=names.EMULATION_MODES, default=default,
                       help=help_text or "cgroup: each device confined to its cores and memory, every time real; "
                                         "sleep: devices sleep to the cost model's time (the model's figures); "
                                         "none: host speed. Default: cgroup where cgroups are writable, else sleep")
    modes.add_argument("--no-emulate", "--no-emulation", dest="emulate", action="store_const", const="none",
                       help="the same as --emulate none")


IMAGE_FORMATS = ("png", "svg", "pdf", "eps", "ps", "jpg", "jpeg")  # matplotlib draws these without extras


def add_image(parser: argparse.ArgumentParser, option: str, what: str, data: tuple[str, ...] = ()) -> None:
    """An option naming the file ``what`` is drawn into, by its suffix (none: PNG); ``data`` are the suffixes
    written as data instead. A suffix that is neither fails as the command starts, not after its work."""
    formats = IMAGE_FORMATS + data
    also = f"; {', '.join('.' + f for f in data)} writes the data" if data else ""
    parser.add_argument(option, default=None, metavar="FILE", type=_suffix_in(formats),
                        help=f"write {what} as PNG, or by its suffix: {', '.join('.' + f for f in IMAGE_FORMATS)}"
                             f"{also} (a bare file name goes under outputs/)")


def _suffix_in(formats: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: the file name as given, if its suffix (any) is one of ``formats``."""
    def file_name(text: str) -> str:
        suffix = Path(text).suffix.lower().lstrip(".")
        if suffix and suffix not in formats:
            raise argparse.ArgumentTypeError(f"{text!r}: a file ending in {', '.join('.' + f for f in formats)}")
        return text
    return file_name


def add_data_commands(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl data info`` and ``ecofl data partition``."""
    parser = subparsers.add_parser("data", help="inspect datasets and partitions")
    commands = parser.add_subparsers(dest="data_command", required=True)
    info = commands.add_parser("info", help="sizes, classes, input shape and source of a dataset")
    info.add_argument("name", metavar="NAME", choices=names.DATASETS, help=one_of(names.DATASETS))
    add_data_source(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    runs(info, "data", "run_info")

    split = commands.add_parser("partition", help="partition a dataset's training labels over clients")
    split.add_argument("name", metavar="NAME", choices=names.DATASETS, help=one_of(names.DATASETS))
    add_data_source(split)
    split.add_argument("--scheme", required=True, choices=names.PARTITION_SCHEMES,
                       help="Eco-FL §6.1's label splits: IID, k-class shards, Dirichlet, RLG-IID, RLG-NIID")
    split.add_argument("--clients", type=int, required=True, help="number of clients (homes)")
    split.add_argument("--seed", type=int, default=0, help="seeds the partition")
    split.add_argument("--classes-per-client", type=int, default=2, help="shards, rlg-*: classes per client")
    split.add_argument("--alpha", type=float, default=0.5, help="dirichlet: concentration")
    split.add_argument("--groups", type=int, default=5, help="rlg-*: response-latency groups")
    split.add_argument("--classes-per-group", type=int, default=3, help="rlg-niid: classes per group")
    split.add_argument("--max-rows", type=int, default=20, help="clients listed in text output (0: all)")
    split.add_argument("--json", action="store_true", help="print JSON (all clients)")
    add_image(split, "--plot", "the label distribution")
    runs(split, "data", "run_partition")


def add_train(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model centrally and print test accuracy")
    add_data(parser, required=False, help_suffix=" (default fashion_mnist)")
    add_model(parser, default="cnn")
    parser.add_argument("--epochs", type=_positive_int, default=1, help="passes over the training split")
    parser.add_argument("--batch", type=int, default=32, help="mini-batch size")
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--limit", type=int, default=None, help="train on the first N samples only")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model and the shuffling")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    runs(parser, "train")


def add_plan(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("plan",
                                   help="plan a model over a home's devices and predict a sync-round or a stream")
    add_model(parser, required=True)
    add_pool(parser)
    add_planner(parser, "ecofl")
    parser.add_argument("--batch", type=int, default=128,
                        help="mini-batch (samples per sync-round); --inference: the samples over which micro-batch "
                             "sizes (its divisors) are compared")
    parser.add_argument("--inference", action="store_true",
                        help="plan pipelined inference (forward-only stream) and predict throughput and latency")
    parser.add_argument("--micro-batch", type=int, default=None, help="fix the micro-batch size")
    parser.add_argument("--micro-batch-rule", default=None, choices=("largest", "fastest"),
                        help="ecofl/pipeedge: fastest estimated round (default) "
                             "or largest size holding P_s tasks (paper)")
    parser.add_argument("--bandwidth", type=float, default=None, help="every link in Mbps (default 100)")
    add_granularity(parser)
    parser.add_argument("--input-shape", default="3,32,32", help="one sample's C,H,W (default 3,32,32)")
    parser.add_argument("--classes", type=int, default=10, help="output classes (default 10)")
    parser.add_argument("--cache-dir", default=None, help=PROFILE_CACHE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_image(parser, "--gantt", "the simulated sync-round (or stream)")
    runs(parser, "plan")


def add_home_train(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl home train``."""
    parser = subparsers.add_parser("train", help="train through the home pipeline and measure it")
    add_model(parser, required=True)
    add_pool(parser)
    add_data(parser)
    add_planner(parser, "ecofl")
    parser.add_argument("--schedule", choices=names.TRAINING_SCHEDULES, default=None,
                        help="override the plan's schedule (async-1f1b: FTPipeHD, no flush, weight stashing)")
    parser.add_argument("--aggregate-every", type=int, default=1,
                        help="async-1f1b: average a stage's last S-s weight versions every this x (S-s) steps (0: off)")
    parser.add_argument("--rounds", type=int, default=3, help="sync-rounds to train")
    parser.add_argument("--batch", type=int, default=64, help="mini-batch (samples per sync-round)")
    parser.add_argument("--micro-batch", type=int, default=None, help="fix the micro-batch size")
    parser.add_argument("--bandwidth", type=float, default=None, help="every link in Mbps (default 100)")
    add_granularity(parser)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    add_emulation(parser)
    parser.add_argument("--calibration", default=None, metavar="FILE",
                        help="cgroup: reuse the devices' measured speeds and plan in FILE, or measure and write "
                             "them there (runs compared side by side then share one plan)")
    parser.add_argument("--tune-after", type=int, default=0, metavar="ROUNDS",
                        help="re-plan on the speeds the devices show in the first ROUNDS sync-rounds (the "
                             "first is a warm-up, so at least 2), if the cost model predicts it pays (0: off; "
                             "once, unless --tune-every)")
    parser.add_argument("--tune-every", type=int, default=0, metavar="ROUNDS",
                        help="with --tune-after: re-tune again every ROUNDS sync-rounds after the first, on the "
                             "rounds since the last (FTPipeHD's periodic re-partition; 0: once)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds any step may take before failing")
    parser.add_argument("--cache-dir", default=None, help=PROFILE_CACHE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_image(parser, "--timeline", "the measured timeline", data=("json",))
    parser.add_argument("--inject", action="append", default=[], metavar="EVENT",
                        help=f"{names.INJECTION_SYNTAX} (repeatable; turns fault tolerance on). A kill or freeze "
                             f"strikes as sync-round R starts, or, with a PHASE, when device D reaches its K-th "
                             f"(default 1st) PHASE from sync-round R on: {', '.join(names.PHASES)}")
    parser.add_argument("--fault-tolerance", action="store_true",
                        help="heartbeats, replication and re-planning even without injected events")
    parser.add_argument("--replan", choices=names.REPLAN_KINDS, default="lightweight",
                        help="re-planning after a failure (default lightweight)")
    parser.add_argument("--replicate-every", type=int, default=1, help="sync-rounds between stage replications")
    parser.add_argument("--global-copy-every", type=int, default=5, help="G: sync-rounds between global copies")
    parser.add_argument("--backups", choices=names.BACKUP_RULES, default=names.BACKUP_RULES[0],
                        help="where a middle stage is backed up: not on the plan's busiest device (default; costs "
                             "every round less) or on both neighbours (moves less when a neighbour is lost)")
    runs(parser, "home_train")


def add_home_infer(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("infer", help="pipelined inference of a trained model across the home's devices")
    add_model(parser, required=True)
    add_pool(parser)
    add_data(parser, help_suffix=" (its test split)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--weights", default=None, help="a weights file (global_model.npz)")
    source.add_argument("--checkpoint", default=None,
                        help="a run's output directory, its checkpoints directory or a checkpoint file")
    add_planner(parser, "pipeedge")
    parser.add_argument("--micro-batch", type=int, default=None, help="fix the micro-batch size")
    parser.add_argument("--batch", type=int, default=64, help="micro-batch sizes the planner tries: its divisors")
    parser.add_argument("--samples", type=int, default=512, help="test samples to stream")
    parser.add_argument("--bandwidth", type=float, default=None, help="every link in Mbps")
    add_granularity(parser)
    add_emulation(parser)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds any step may take before failing")
    parser.add_argument("--cache-dir", default=None, help=PROFILE_CACHE_HELP)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_image(parser, "--timeline", "the measured timeline", data=("json",))
    runs(parser, "home_infer")


def add_home_serve(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl home serve``."""
    parser = subparsers.add_parser("serve", help="the home service: registry of the devices, trains for the ClientApp")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="address for device daemons and the ClientApp (default: loopback, a free port)")
    parser.add_argument("--secret-file", default=None, help=SECRET_HELP)
    parser.add_argument("--name", default="home", help="the home's name (default home)")
    parser.add_argument("--portal-preset", default=None, help="emulate this preset as the portal device")
    add_planner(parser, "ecofl")
    add_emulation(parser, default="none",
                  help_text="none (default): real devices (no dilation, budgets or pacing), planned and predicted "
                            "at the speeds they measured; sleep: devices that claim a preset sleep to the cost "
                            "model (demos); cgroup: the devices are confined (the portal's stage here, each daemon "
                            "by whoever started it) and measured for real, links paced")
    parser.add_argument("--kernel-links", action="store_true",
                        help="emulated devices whose links the kernel shapes (namespaces + tc): "
                             "no pacing in the pipeline")
    parser.add_argument("--every-device", action="store_true",
                        help="plan every round on every device present (the planner's own plan); by default, where "
                             "devices compute for real, a device predicted to slow the home stays idle")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a device may take to join or answer")
    parser.add_argument("--port-file", default=None, help="write the port listened on to this file once ready")
    runs(parser, "home_serve")


def add_home_status(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl home status``."""
    status = subparsers.add_parser("status", help="a running home service's devices and rounds")
    status.add_argument("--home", required=True, metavar="HOST:PORT", help="the home service's address")
    status.add_argument("--secret-file", default=None, help=SECRET_HELP)
    status.add_argument("--json", action="store_true", help="print one JSON object")
    runs(status, "home_status")


def add_device_serve(subparsers: argparse._SubParsersAction) -> None:
    """``ecofl device serve``."""
    parser = subparsers.add_parser("serve", help="join the home service and run pipeline workers until stopped")
    parser.add_argument("--home", required=True, metavar="HOST:PORT", help="the home service's address")
    parser.add_argument("--secret-file", default=None, help=SECRET_HELP)
    parser.add_argument("--name", default=socket.gethostname(), help="this device's name (default: host name)")
    parser.add_argument("--preset", default=None,
                        help="claim a device preset (emulated: tests and demos) instead of measuring this machine")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="this device's link in Mbps")
    parser.add_argument("--accelerator", default="auto", metavar="auto|cpu|cuda|cuda:N",
                        help="where this device trains its stage (default auto: its GPU if it has one, else the CPU; "
                             "a --preset trains on the CPU unless told)")
    runs(parser, "device_serve")


def image_path(text: str) -> Path:
    """Where an image option's FILE is written: a bare file name under ``outputs/`` (never the repository's
    root), anything else as given; its folder is made."""
    path = Path(text)
    if not path.is_absolute() and path.parent == Path("."):
        path = Path("outputs") / path
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
