"""A home whose devices train their stages on a GPU, against the same home on CPU threads, and both against
the single-process reference (issue 42).

    .venv/bin/python -m benchmarks.pipeline_accelerators                    # every accelerator this machine has
    .venv/bin/python -m benchmarks.pipeline_accelerators --model resnet18 --rounds 3

One home of three devices, each a stage of the model (an even split of its
layers, one device per stage, 1F1B-Sync with M micro-batches), trains
``--rounds`` sync-rounds of random CIFAR-shaped inputs at host speed
(``emulate="none"``), once with every device on the CPU (a worker process of
one thread each) and, where there is a GPU, once with every device's
``accelerator: cuda`` (three worker processes sharing ``cuda:0``). Each run
starts from the same weights; its weights are compared with the same
sync-rounds trained in this process on the same device
(:func:`ecofl.train.accumulate_gradients` over the same micro-batches, then
SGD). ``max_abs_diff`` is the largest difference of any weight or buffer after
the first sync-round (an untimed one: it also warms up cuDNN's algorithm choice
and the allocators), and a run is ``exact`` when it is at most
:data:`TOLERANCE`. Over several SGD steps through batch-norm float32 rounding
is amplified (the reference on 1 and on 2 CPU threads ends 3.2e-4 apart after 3
sync-rounds), so after the timed sync-rounds the row gives the difference
(``max_abs_diff_after_rounds``) beside the reference's own float32 rounding
there, its distance from the same sync-rounds in float64
(``float32_rounding_after_rounds``). On a GPU both sides run in full float32
(TF32 off: :func:`ecofl.accelerator.resolve_device`).

A row's ``sync_round_s`` is the median sync-round measured at the portal;
``speedup_vs_cpu`` divides the same machine's CPU row by it, measured one
after the other in one process. Rows merge into
``benchmarks/results/pipeline_accelerators.json`` by machine and
accelerator; the table goes to ``docs/pipeline_accelerators.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.markdown_section import replace_section
from ecofl.accelerator import device_label, resolve_device
from ecofl.devices import GB, DeviceSpec, HomePool
from ecofl.pipeline.plan import Plan, StagePlan
from ecofl.pipeline.runtime.model_spec import ZooModel
from ecofl.pipeline.runtime.portal import HomePipeline
from ecofl.train import accumulate_gradients
from ecofl.weights import get_weights, set_weights

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "pipeline_accelerators.json"
DOC = ROOT / "docs" / "pipeline_accelerators.md"
DEVICES = 3
TOLERANCE = 1e-5  # largest weight difference after one sync-round that counts as exact (float32 summation order)
LR = 0.05


def machine() -> str:
    cores = os.cpu_count() or 1
    gpu = f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return f"{cores}-core {platform.machine()}{gpu}"


def even_plan(layers: int, micro_batch: int, micro_batches: int) -> Plan:
    """Three stages of consecutive layers, as even as the layer count allows, one device each."""
    bounds = np.linspace(0, layers, DEVICES + 1).round().astype(int)
    stages = tuple(StagePlan((int(lo), int(hi) - 1), (s,), (micro_batch,), DEVICES - s)
                   for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])))
    return Plan("even", stages, micro_batch=micro_batch, num_micro_batches=micro_batches)


def reference(spec: ZooModel, weights, x, y, plan: Plan, rounds: int, device: torch.device,
              dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    """The sync-rounds trained in this process on ``device``: accumulated micro-batch gradients, one SGD step."""
    model, _ = spec.build()
    set_weights(model, weights)
    model.to(device, dtype).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for r in range(rounds):
        batch = slice(r * plan.batch_size, (r + 1) * plan.batch_size)
        accumulate_gradients(model, x[batch].to(device, dtype), y[batch].to(device), plan.num_micro_batches)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return get_weights(model)


def measure(spec: ZooModel, accelerator: str, rounds: int, micro_batch: int, micro_batches: int) -> dict:
    """One row: the home on ``accelerator``, timed and compared with the reference on the same device."""
    device = resolve_device(accelerator)
    torch.manual_seed(0)
    model, layers = spec.build()
    weights = get_weights(model)
    plan = even_plan(len(layers), micro_batch, micro_batches)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rounds * plan.batch_size, *spec.input_shape, generator=generator)
    y = torch.randint(0, spec.num_classes, (len(x),), generator=generator)
    pool = HomePool(f"{accelerator}-home", tuple(DeviceSpec(f"device-{d}", 1.0, 8 * GB, 1e9, accelerator)
                                                 for d in range(DEVICES)))
    load, started = os.getloadavg()[0], time.perf_counter()
    with HomePipeline(spec, pool, plan, emulate="none", timeout_s=600) as home:
        first = home.train(weights, x, y, sync_rounds=1, lr=LR)  # untimed: the exactness check and the warm-up
        result = home.train(weights, x, y, sync_rounds=rounds, lr=LR)
    wall = time.perf_counter() - started
    diff = _largest_difference(first.weights, reference(spec, weights, x, y, plan, 1, device))
    expected = reference(spec, weights, x, y, plan, rounds, device)
    rounding = _largest_difference(expected, reference(spec, weights, x, y, plan, rounds, device, torch.float64))
    return {
        "machine": machine(), "accelerator": accelerator, "device": device_label(device), "model": spec.name,
        "devices": DEVICES, "stages": [list(s.layers) for s in plan.stages], "micro_batch": micro_batch,
        "micro_batches": micro_batches, "rounds": rounds, "sync_round_s": statistics.median(result.sync_round_s),
        "sync_rounds_s": list(result.sync_round_s), "max_abs_diff": diff, "tolerance": TOLERANCE,
        "exact": diff <= TOLERANCE, "max_abs_diff_after_rounds": _largest_difference(result.weights, expected),
        "float32_rounding_after_rounds": rounding, "peak_accelerator_bytes": list(result.peak_accelerator_bytes),
        "peak_rss_bytes": list(result.peak_rss_bytes), "wall_s": wall, "load_before": load,
        "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
    }


def _largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max()) for x, y in zip(a, b))


def merge(old: list[dict], new: list[dict], keys: tuple[str, ...] = ("machine", "model", "accelerator")
          ) -> list[dict]:
    """``old`` rows with ``new`` ones added, a new row replacing an old one of the same ``keys``."""
    rows = {tuple(r[k] for k in keys): r for r in [*old, *new]}
    return list(rows.values())


def speedup_cell(row: dict) -> str:
    """A row's speed-up over its CPU baseline (empty for the baseline itself)."""
    return f"{row['speedup_vs_cpu']:.1f}x" if row.get("speedup_vs_cpu") else ""


def markdown(rows: list[dict]) -> str:
    lines = ["| machine | model | devices on | sync-round (s) | speed-up vs CPU | weight diff after 1 sync-round | "
             "exact | weight diff after the timed ones | float32 rounding there | date |",
             "|---|---|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['machine']} | {r['model']} | {r['device']} (x{r['devices']}) | {r['sync_round_s']:.3f} | "
                     f"{speedup_cell(r)} | {r['max_abs_diff']:.1e} | {r['exact']} | "
                     f"{r['max_abs_diff_after_rounds']:.1e} | {r['float32_rounding_after_rounds']:.1e} | {r['date']} |")
    if not any(r["accelerator"] != "cpu" for r in rows):
        lines.append("| not measured | | cuda | not measured | | | | | | |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18", help="a zoo model without dropout (its draws would differ)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args()
    spec = ZooModel(args.model, (3, 32, 32), 10, "block")
    accelerators = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for accelerator in accelerators:
        row = measure(spec, accelerator, args.rounds, args.micro_batch, args.micro_batches)
        print(json.dumps(row), flush=True)
        rows.append(row)
    for row in rows[1:]:
        row["speedup_vs_cpu"] = rows[0]["sync_round_s"] / row["sync_round_s"]
    results = json.loads(args.json.read_text()) if args.json.exists() else {}  # its "homes" too (accelerator_homes)
    merged = merge(results.get("rows", []), rows)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({**results, "rows": merged}, indent=1))
    table = markdown(merged)
    if not replace_section(args.doc, table):
        print(f"{args.doc} has no benchmark section")
    print(table)


if __name__ == "__main__":
    main()
