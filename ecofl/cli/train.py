"""``ecofl train``: train a model centrally on one dataset and print its test accuracy.

The centralised reference for the federated runs (same model, data and
optimizer as a home's local training, ecofl.train).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ecofl.data import load_dataset
from ecofl.models import build_model
from ecofl.train import TrainConfig, evaluate, train_local


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("train", help="train a model centrally and print test accuracy")
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=_positive_int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N samples only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default=None, help="dataset root (torchvision layout)")
    parser.add_argument("--download", action="store_true", help="allow torchvision downloads")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def run(args: argparse.Namespace) -> int:
    dataset = load_dataset(args.dataset, root=args.root, download=args.download)
    torch.manual_seed(args.seed)
    model = build_model(args.model, dataset.input_shape, dataset.num_classes)
    x, y = dataset.train.x[: args.limit], dataset.train.y[: args.limit]
    config = TrainConfig(
        epochs=1, batch_size=args.batch, lr=args.lr, momentum=args.momentum, seed=args.seed
    )
    rows = []
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        result = train_local(model, x, y, TrainConfig(**{**config.__dict__, "seed": args.seed + epoch}))
        test = evaluate(model, dataset.test.x, dataset.test.y)
        rows.append(
            {"epoch": epoch, "train_loss": result.loss, "test_loss": test.loss,
             "test_accuracy": test.accuracy, "elapsed_s": time.perf_counter() - started}
        )
        if not args.json:
            print(f"epoch {epoch}/{args.epochs}: train loss {result.loss:.4f}  "
                  f"test loss {test.loss:.4f}  test accuracy {test.accuracy:.4f}", flush=True)
    summary = {"dataset": dataset.name, "source": dataset.source, "model": args.model,
               "train_samples": len(x), "epochs": rows, "accuracy": rows[-1]["test_accuracy"]}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"accuracy: {summary['accuracy']:.4f} ({args.model} on {dataset.name}, {len(x)} samples)")
    return 0
