"""``ecofl data``: inspect the datasets and how a partition spreads them over homes.

``ecofl data info NAME`` prints split sizes, classes, input shape and where
the files came from. ``ecofl data partition NAME --scheme S --clients N``
partitions the training labels (Eco-FL §6.1 schemes) and prints each
client's size and label histogram, per-group class sets for the RLG
schemes, and a summary (sizes, classes per client, mean JS divergence to
uniform); ``--plot FILE`` also draws the label distribution.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from ecofl.accelerator import host_array
from ecofl.cli.options import image_path
from ecofl.data import (
    default_client_groups,
    label_histograms,
    load_dataset,
    partition,
    partition_summary,
)
from ecofl.data.plot import plot_label_distribution

# the keyword arguments of ecofl.data.partition each scheme uses
SCHEME_PARAMETERS: dict[str, tuple[str, ...]] = {
    "iid": (),
    "shards": ("classes_per_client",),
    "dirichlet": ("alpha",),
    "rlg-iid": ("classes_per_client", "num_groups"),
    "rlg-niid": ("classes_per_client", "num_groups", "classes_per_group"),
}


def run_info(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.name, root=args.data_root, download=args.download)
    report = {
        "name": dataset.name,
        "train": len(dataset.train),
        "test": len(dataset.test),
        "num_classes": dataset.num_classes,
        "class_names": list(dataset.class_names),
        "input_shape": list(dataset.input_shape),
        "source": dataset.source,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{dataset.name}  ({dataset.source})")
    print(f"  train        {report['train']}")
    print(f"  test         {report['test']}")
    print(f"  classes      {dataset.num_classes}: {', '.join(dataset.class_names)}")
    print(f"  input shape  {'x'.join(str(d) for d in dataset.input_shape)}")
    return 0


def run_partition(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.name, root=args.data_root, download=args.download)
    labels = host_array(dataset.train.y)
    all_parameters = {
        "classes_per_client": args.classes_per_client,
        "alpha": args.alpha,
        "num_groups": args.groups,
        "classes_per_group": args.classes_per_group,
    }
    parameters = {key: all_parameters[key] for key in SCHEME_PARAMETERS[args.scheme]}
    parts = partition(labels, args.scheme, args.clients, seed=args.seed, **parameters)
    histograms = label_histograms(labels, parts, dataset.num_classes)
    groups = default_client_groups(args.clients, args.groups) if args.scheme.startswith("rlg") else None
    report = _partition_report(dataset.name, dataset.source, args, parameters, histograms, groups)
    report["class_names"] = list(dataset.class_names)
    plot = image_path(args.plot) if args.plot else None
    if plot:
        title = f"{dataset.name}: {args.scheme}, {args.clients} clients, seed {args.seed}"
        plot_label_distribution(histograms, plot, class_names=dataset.class_names,
                                title=title, groups=groups)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_partition(report, args.max_rows)
        if plot:
            print(f"plot written to {plot}")
    return 0


def _partition_report(
    name: str,
    source: str,
    args: argparse.Namespace,
    parameters: dict[str, Any],
    histograms: np.ndarray,
    groups: np.ndarray | None,
) -> dict[str, Any]:
    clients = []
    for client, histogram in enumerate(histograms):
        row: dict[str, Any] = {"client": client, "size": int(histogram.sum()), "histogram": histogram.tolist()}
        if groups is not None:
            row["group"] = int(groups[client])
        clients.append(row)
    report: dict[str, Any] = {
        "dataset": name,
        "source": source,
        "scheme": args.scheme,
        "num_clients": args.clients,
        "seed": args.seed,
        "parameters": parameters,
        "clients": clients,
        "summary": partition_summary(histograms),
    }
    if groups is not None:
        report["groups"] = [
            {
                "group": int(group),
                "clients": int((groups == group).sum()),
                "size": int(histograms[groups == group].sum()),
                "classes": np.flatnonzero(histograms[groups == group].sum(axis=0)).tolist(),
            }
            for group in np.unique(groups)
        ]
    return report


def _print_partition(report: dict[str, Any], max_rows: int) -> None:
    """Compact text: one line per client ('.' for an absent class), groups, summary."""
    parameters = ", ".join(f"{k}={v}" for k, v in report["parameters"].items())
    print(f"{report['dataset']}: {report['scheme']} over {report['num_clients']} clients, "
          f"seed {report['seed']}{', ' + parameters if parameters else ''} ({report['summary']['samples']} "
          f"training samples from {report['source']})")
    clients = report["clients"]
    shown = clients if max_rows <= 0 else clients[:max_rows]
    width = max(4, *(len(str(c["size"])) for c in clients))
    cell = max(2, max(len(str(n)) for c in clients for n in c["histogram"]))
    has_group = "group" in clients[0]
    header = f"{'client':>6} {'group':>5} " if has_group else f"{'client':>6} "
    classes = len(clients[0]["histogram"])
    print(header + f"{'size':>{width}}  labels 0..{classes - 1}")
    for c in shown:
        counts = " ".join(f"{n if n else '.':>{cell}}" for n in c["histogram"])
        group = f"{c['group']:>5} " if has_group else ""
        print(f"{c['client']:>6} {group}{c['size']:>{width}}  {counts}")
    if len(shown) < len(clients):
        print(f"   ... {len(clients) - len(shown)} more clients (--max-rows 0 or --json for all)")
    for g in report.get("groups", []):
        print(f"group {g['group']}: {g['clients']} clients, {g['size']} samples, "
              f"classes {' '.join(str(c) for c in g['classes'])}")
    s = report["summary"]
    print("summary")
    print(f"  client size         min {s['size_min']}, median {s['size_median']:g}, max {s['size_max']}")
    print(f"  classes per client  min {s['classes_min']}, mean {s['classes_mean']:.2f}, max {s['classes_max']}")
    print(f"  mean JS divergence to uniform (base 2): {s['js_to_uniform_mean']:.3f}")
