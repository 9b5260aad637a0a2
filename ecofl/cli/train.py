"""``ecofl train``: train a model centrally on one dataset and print its test accuracy.

The centralised reference for the federated runs (same model, data and
optimizer as a home's local training, ecofl.train).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ecofl.allocator import keep_freed_memory
from ecofl.data import load_dataset
from ecofl.models import build_model
from ecofl.train import TrainConfig, evaluate, train_local


def run(args: argparse.Namespace) -> int:
    keep_freed_memory()  # as a home's training does (ecofl.allocator)
    dataset = load_dataset(args.dataset, root=args.data_root, download=args.download)
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
