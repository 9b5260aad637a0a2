"""Planner benchmark: planning time and predicted throughput (Asteroid Tables 4 and 7).

1. Planning time on this machine for EfficientNet-B1 on Env C (asteroid-c:
   1 NX, 2 TX2, 3 Nano) and Env B (asteroid-b: 3 NX, 2 TX2), at block and fine
   granularity of our model zoo, and at Asteroid's 213 layers: the fine
   profile with each layer split evenly into 2-3 pieces (synthetic; the zoo
   keeps residual blocks whole, so its "fine" EfficientNet-B1 has fewer
   layers). Targets: ecofl < 1 s, hpp < 10 s at the finest granularity
   (Asteroid's planner takes 480 s on a Jetson NX, Table 7).
2. Predicted throughput (samples/s, :func:`ecofl.pipeline.cost.simulate`) of
   every planner's plan for EfficientNet-B1, MobileNetV2 and ResNet-50 on
   Env A (5 Nano) and Env B at 100 and 1000 Mbps, the shape of Asteroid
   Table 4 (mini-batch 2048, ResNet-50 256), with the ratios over dp and even.
3. Transformer partition units (PipeEdge §III-C): predicted throughput of
   bert_small cut into whole blocks, into whole encoder layers and into
   attention / MLP units, for training (a 1F1B-Sync sync-round) and for
   inference (the steady state of a stream,
   :func:`ecofl.pipeline.stream.simulate_stream`), on Env B, Env C and
   Eco-FL's Nano + TX2. All three cuts come from the one measured fine
   profile, merged into blocks or whole encoder layers (synthetic, like the
   213-layer refinement), so they differ only in where a planner may cut.

Profiles are measured on this host at 3x32x32 inputs (cached on disk), so
absolute numbers are emulated Jetsons (ecofl.devices), not real ones; every
throughput here is the cost model's prediction (nothing runs a model).

    .venv/bin/python benchmarks/planner.py [--cache-dir DIR] [--granularity fine|block] [--only transformer]

writes benchmarks/results/planner.json and docs/planner.md; ``--only
transformer`` re-runs part 3 alone and replaces only its section of the page
(and its key of the JSON).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import END, START, replace_section  # noqa: E402
from ecofl.errors import UserError  # noqa: E402
from ecofl.pipeline.cost import simulate  # noqa: E402
from ecofl.pipeline.planners import PLANNERS, make_plan  # noqa: E402
from ecofl.pipeline.profile import ModelProfile, profile_zoo_model  # noqa: E402
from ecofl.pipeline.stream import simulate_stream  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

SHAPE = (3, 32, 32)
CLASSES = 10
TIMING_POOLS = ("asteroid-c", "asteroid-b")
TIMING_BATCH = 2048
THROUGHPUT_MODELS = {"efficientnet_b1": 2048, "mobilenet_v2": 2048, "resnet50": 256}
THROUGHPUT_ENVS = (("asteroid-a", 100), ("asteroid-b", 100), ("asteroid-b", 1000))
#: Table columns: label -> (planner, options). "*-largest" use the paper's literal
#: micro-batch rule (largest size holding P_s tasks); the default is "fastest".
VARIANTS: dict[str, tuple[str, dict]] = {
    "dp": ("dp", {}),
    "even": ("even", {}),
    "pipeedge-largest": ("pipeedge", {"micro_batch_rule": "largest"}),
    "ecofl-largest": ("ecofl", {"micro_batch_rule": "largest"}),
    "pipeedge": ("pipeedge", {}),
    "ecofl": ("ecofl", {}),
    "hpp": ("hpp", {}),
}
ORDER = tuple(VARIANTS)
RATIOS = ("pipeedge", "ecofl", "ecofl-largest", "hpp")
TRANSFORMER = "bert_small"
TRANSFORMER_BATCH = 256  # training mini-batch; inference: the horizon micro-batch sizes are compared over
TRANSFORMER_ENVS = (("asteroid-b", 100), ("asteroid-c", 100), ("ecofl-hetero", 100))
TRANSFORMER_PLANNERS = ("pipeedge", "ecofl", "hpp", "even")
OBJECTIVES = ("training", "inference")


def refine(profile: ModelProfile, target: int) -> ModelProfile:
    """Split each layer into equal pieces so that there are ``target`` layers (synthetic).

    Times, FLOPs, stash, weights and optimizer state are divided among a
    layer's pieces; every cut inside a layer carries the layer's output
    activation and input gradient.
    """
    n = profile.num_layers
    pieces = np.full(n, target // n) + (np.arange(n) < target % n)
    index = np.repeat(np.arange(n), pieces)
    share = 1.0 / pieces[index]
    scale = lambda a: np.asarray(a)[index] * share  # noqa: E731
    step = None if profile.optimizer_step_s is None else scale(profile.optimizer_step_s)
    return replace(
        profile,
        model=f"{profile.model}-refined{target}",
        layer_names=tuple(f"{profile.layer_names[i]}.{k}" for i, p in enumerate(pieces) for k in range(p)),
        forward_s=profile.forward_s[index] * share[:, None],
        backward_s=profile.backward_s[index] * share[:, None],
        activation_bytes=np.asarray(profile.activation_bytes)[index],
        gradient_bytes=np.asarray(profile.gradient_bytes)[index],
        stash_bytes=scale(profile.stash_bytes),
        weight_bytes=scale(profile.weight_bytes),
        optimizer_bytes=scale(profile.optimizer_bytes),
        flops=scale(profile.flops),
        optimizer_step_s=step,
    )


def merge_layers(profile: ModelProfile, group: Callable[[str], str], suffix: str) -> ModelProfile:
    """The profile with consecutive layers of the same ``group(name)`` merged into one layer (synthetic).

    Times, FLOPs, stash, weights, optimizer state and step times add up; a
    merged layer sends its last layer's output and receives its first layer's
    input gradient. Like :func:`refine`, the same measurements cut elsewhere.
    """
    groups: list[list[int]] = []
    for i, name in enumerate(profile.layer_names):
        if groups and group(profile.layer_names[groups[-1][0]]) == group(name):
            groups[-1].append(i)
        else:
            groups.append([i])
    first, last = [g[0] for g in groups], [g[-1] for g in groups]
    add = lambda a: np.array([np.asarray(a)[g].sum(axis=0) for g in groups])  # noqa: E731
    return replace(
        profile,
        model=f"{profile.model}-{suffix}",
        layer_names=tuple(group(profile.layer_names[g[0]]) for g in groups),
        forward_s=add(profile.forward_s),
        backward_s=add(profile.backward_s),
        activation_bytes=np.asarray(profile.activation_bytes)[last],
        gradient_bytes=np.asarray(profile.gradient_bytes)[first],
        stash_bytes=add(profile.stash_bytes),
        weight_bytes=add(profile.weight_bytes),
        optimizer_bytes=add(profile.optimizer_bytes),
        flops=add(profile.flops),
        optimizer_step_s=None if profile.optimizer_step_s is None else add(profile.optimizer_step_s),
    )


def whole_encoder_layers(name: str) -> str:
    """``encoder0[attention]`` and ``encoder0[feed_forward]`` -> ``encoder0``; other layers stay."""
    return re.sub(r"\[(attention|feed_forward)\]$", "", name)


def whole_blocks(name: str) -> str:
    """The model's block a fine layer belongs to: ``embeddings.3`` -> ``embeddings``."""
    return re.split(r"[.\[]", name, maxsplit=1)[0]


def predicted_throughput(profile: ModelProfile, pool_name: str, mbps: int, planner: str, objective: str) -> dict:
    """The planner's plan for ``objective`` and its predicted throughput (sync-round or stream steady state)."""
    pool = load_pool(pool_name, mbps)
    try:
        plan = make_plan(planner, profile, pool, TRANSFORMER_BATCH, objective=objective)
    except UserError as error:
        return {"throughput": None, "plan": str(error)}
    if objective == "inference":
        stream = simulate_stream(plan, profile, pool)
        extra = {"latency_s": stream.latency_s, "period_s": stream.period_s}
        throughput = stream.throughput
    else:
        throughput, extra = simulate(plan, profile, pool).throughput, {}
    stages = [[list(st.layers), list(st.devices), list(st.shares)] for st in plan.stages]
    return {"throughput": throughput, "micro_batch": plan.micro_batch, "stages": stages, **extra}


def transformer_units(cache_dir: str | None) -> list[dict]:
    """Every cut from one measured profile (the fine one), so the columns differ only in where a planner may cut."""
    fine = profile_zoo_model(TRANSFORMER, SHAPE, CLASSES, "fine", cache_dir)
    profiles = {
        "block": merge_layers(fine, whole_blocks, "blocks"),
        "whole_layers": merge_layers(fine, whole_encoder_layers, "whole-layers"),
        "units": fine,
    }
    rows = []
    for pool_name, mbps in TRANSFORMER_ENVS:
        for objective in OBJECTIVES:
            for planner in TRANSFORMER_PLANNERS:
                row = {"pool": pool_name, "mbps": mbps, "objective": objective, "planner": planner,
                       "layers": {cut: profile.num_layers for cut, profile in profiles.items()}}
                for cut, profile in profiles.items():
                    row[cut] = predicted_throughput(profile, pool_name, mbps, planner, objective)
                rows.append(row)
                print(f"  {TRANSFORMER} {pool_name} {mbps} Mbps {objective:9s} {planner:8s} "
                      + ", ".join(f"{cut}={row[cut]['throughput'] or 0:.1f}" for cut in profiles), file=sys.stderr)
    return rows


def transformer_markdown(rows: list[dict], command: str) -> str:
    layers = rows[0]["layers"]
    lines = [
        f"## Transformer partition units: {TRANSFORMER}, training and inference",
        "",
        f"Generated by `{command}` ({platform.processor() or platform.machine()}, {time.strftime('%Y-%m-%d')}). "
        f"Predicted samples/s of {TRANSFORMER} (4 post-norm encoder layers, hidden 256, 65 tokens of 3x32x32 "
        "inputs) cut three ways: whole blocks (the `block` granularity's cuts), whole encoder layers, and "
        "attention / MLP units (`fine`: each sub-layer with its residual and norm, PipeEdge §III-C, cut where "
        "the residual closes). All three come from the one host-measured `fine` profile, its layers merged "
        "into blocks or whole encoder layers (synthetic), so the columns differ only in where a planner may "
        "cut, not in measurement noise (the machine is shared). Training: one 1F1B-Sync sync-round of mini-batch "
        f"{TRANSFORMER_BATCH} (`ecofl.pipeline.cost.simulate`). Inference: the steady state of a forward-only "
        "stream of the inference plan (`make_plan(..., objective=\"inference\")`, "
        "`ecofl.pipeline.stream.simulate_stream`). These are predictions of the cost model from host-measured "
        "profiles and emulated device speeds, not runs: under emulation measured = predicted by construction. "
        "Env B = 3 NX + 2 TX2, Env C = 1 NX + 2 TX2 + 3 Nano, ecofl-hetero = Nano (10 W) + TX2 (Max-N). "
        "`-` = no plan fits memory. The chain planners minimise the per-micro-batch bottleneck (Eco-FL eq. 1, "
        "PipeEdge eq. 3), which a finer cut never raises; a training sync-round also pays 1F1B's fill and "
        "dependency bubbles, which that objective does not see, so a finer cut can still lengthen it a little. "
        "An inference stream has no such bubbles: it runs at its bottleneck.",
        "",
        "**The inference objective.** `make_plan(planner, profile, pool, batch, objective=\"inference\")` plans "
        "a forward-only stream (plan schedule `stream`, no backward, no flush): a stage costs its forward, a cut "
        "carries the activation only (PipeEdge's P_j), and the portal's own transfers (inputs to the first stage, "
        "predictions back from the last) join the max, so a chain's DP value (PipeEdge eq. 3) is the period the "
        "simulated stream settles to. Memory per device is MEM = W + y (K (x_in + x_out) + T): the stage's "
        "weights (no gradients, no optimizer state, nothing stashed for backward), K held micro-batches of y "
        "samples holding the stage's input and output, and one forward's working set T (the largest stash + "
        "output of its layers); a stage holds K = 3 micro-batches (one arriving, one in its forward, one being "
        "sent on) where memory allows. `pipeedge` chooses which devices to use and their order (it leaves out a "
        "device that would become the bottleneck); `ecofl` and `even` use every device, `hpp` every device in "
        "data-parallel groups. `ecofl plan --inference` prints such a plan with its predicted throughput and "
        "latency.",
        "",
        f"| env | Mbps | objective | planner | block ({layers['block']}) | whole layers ({layers['whole_layers']}) "
        f"| units ({layers['units']}) | units / whole layers | units / block |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        value = {cut: r[cut]["throughput"] for cut in ("block", "whole_layers", "units")}
        cells = [f"{v:.1f}" if v else "-" for v in value.values()]
        lines.append(f"| {r['pool']} | {r['mbps']} | {r['objective']} | {r['planner']} | " + " | ".join(cells)
                     + f" | {_ratio(value['units'], value['whole_layers'])}"
                       f" | {_ratio(value['units'], value['block'])} |")
    return "\n".join(lines)


def planning_times(cache_dir: str | None) -> list[dict]:
    fine = profile_zoo_model("efficientnet_b1", SHAPE, CLASSES, "fine", cache_dir)
    profiles = {
        "block": profile_zoo_model("efficientnet_b1", SHAPE, CLASSES, "block", cache_dir),
        "fine": fine,
        "213 (refined fine)": refine(fine, 213),
    }
    rows = []
    for pool_name in TIMING_POOLS:
        pool = load_pool(pool_name)
        for granularity, profile in profiles.items():
            for planner in PLANNERS:
                started = time.perf_counter()
                try:
                    plan = make_plan(planner, profile, pool, TIMING_BATCH)
                    stages = len(plan.stages)
                except UserError as error:
                    stages, plan = str(error), None
                elapsed = time.perf_counter() - started
                rows.append({"pool": pool_name, "granularity": granularity, "layers": profile.num_layers,
                             "planner": planner, "planning_s": elapsed, "stages": stages})
                print(f"  plan {pool_name:10s} {granularity:18s} {planner:8s} {elapsed:7.3f} s", file=sys.stderr)
    return rows


def throughputs(cache_dir: str | None, granularity: str) -> list[dict]:
    rows = []
    for model, batch in THROUGHPUT_MODELS.items():
        profile = profile_zoo_model(model, SHAPE, CLASSES, granularity, cache_dir)
        for pool_name, mbps in THROUGHPUT_ENVS:
            pool = load_pool(pool_name, mbps)
            row = {"model": model, "layers": profile.num_layers, "pool": pool_name, "mbps": mbps, "batch": batch}
            for planner, (name, options) in VARIANTS.items():
                try:
                    plan = make_plan(name, profile, pool, batch, **options)
                    cost = simulate(plan, profile, pool)
                    row[planner] = cost.throughput
                    row[f"{planner}_plan"] = {
                        "micro_batch": plan.micro_batch,
                        "stages": [[list(st.layers), list(st.devices), list(st.shares)] for st in plan.stages],
                    }
                except UserError as error:
                    row[planner] = None
                    row[f"{planner}_plan"] = str(error)
            rows.append(row)
            print(f"  throughput {model} {pool_name} {mbps} Mbps: "
                  + ", ".join(f"{p}={row[p] or 0:.1f}" for p in ORDER), file=sys.stderr)
    return rows


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if not a or not b else f"{a / b:.2f}x"


def markdown(timing: list[dict], throughput: list[dict], transformer: str, command: str, granularity: str) -> str:
    lines = [
        "# Planner benchmark",
        "",
        f"Generated by `{command}` ({platform.processor() or platform.machine()}, "
        f"{time.strftime('%Y-%m-%d')}). Profiles: host-measured at {'x'.join(map(str, SHAPE))}, "
        "devices emulated by relative speed (ecofl/devices.py); see benchmarks/planner.py.",
        "",
        f"## Planning time, EfficientNet-B1, mini-batch {TIMING_BATCH} (seconds on this machine)",
        "",
        "Targets: ecofl < 1 s, hpp < 10 s at the finest granularity; Asteroid's planner takes 480 s "
        "for the 213-layer EfficientNet-B1 on a Jetson NX (Table 7). The 213-layer row splits the "
        "zoo's fine layers into 2-3 pieces each (synthetic) to match Asteroid's count.",
        "",
        "| pool | granularity | layers | " + " | ".join(PLANNERS) + " |",
        "|---|---|---|" + "---|" * len(PLANNERS),
    ]
    keys = sorted({(r["pool"], r["granularity"], r["layers"]) for r in timing}, key=lambda k: (k[0], k[2]))
    for pool, gran, layers in keys:
        cells = [f"{r['planning_s']:.3f}" for p in PLANNERS for r in timing
                 if (r["pool"], r["granularity"], r["planner"]) == (pool, gran, p)]
        lines.append(f"| {pool} | {gran} | {layers} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"## Predicted throughput (samples/s, simulated sync-round), {granularity} granularity",
        "",
        "Shape of Asteroid Table 4: mini-batch 2048 (ResNet-50: 256); Env A = 5 Nano, Env B = 3 NX + 2 TX2. "
        "`-` = the planner finds no plan that fits memory.",
        "",
        "Columns `*-largest`: the same planner with the paper's literal `micro_batch_rule=\"largest\"` (the "
        "largest micro-batch size that holds P_s tasks) instead of the default `fastest` (of those sizes, the "
        "one of least estimated sync-round). Ratios: "
        "throughput over dp / over even.",
        "",
        "| model | env | Mbps | " + " | ".join(ORDER) + " | " + " | ".join(f"{p} /dp, /even" for p in RATIOS) + " |",
        "|---|---|---|" + "---|" * (len(ORDER) + len(RATIOS)),
    ]
    for r in throughput:
        cells = [f"{r[p]:.1f}" if r[p] else "-" for p in ORDER]
        ratios = [f"{_ratio(r[p], r['dp'])}, {_ratio(r[p], r['even'])}" for p in RATIOS]
        lines.append(f"| {r['model']} ({r['layers']}) | {r['pool']} | {r['mbps']} | "
                     + " | ".join(cells + ratios) + " |")
    lines += ["", START, transformer, END]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", default=None, help="profile cache (default ~/.cache/ecofl/profiles)")
    parser.add_argument("--granularity", default="fine", help="layer granularity of the throughput table")
    parser.add_argument("--only", choices=("transformer",), default=None,
                        help="re-run only the transformer partition units (its section of the page)")
    args = parser.parse_args(argv)
    out = ROOT / "benchmarks" / "results" / "planner.json"
    doc = ROOT / "docs" / "planner.md"
    if args.only == "transformer":
        command = "python benchmarks/planner.py --only transformer"
        rows = transformer_units(args.cache_dir)
        table = transformer_markdown(rows, command)
        result = json.loads(out.read_text()) if out.exists() else {}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**result, "transformer": rows, "transformer_command": command}, indent=1))
        if not replace_section(doc, table):  # a page from before this section: append it
            existing = doc.read_text() if doc.exists() else ""
            doc.write_text(f"{existing}\n{START}\n{table}\n{END}\n")
        print(table)
        return 0
    command = "python benchmarks/planner.py" + (f" --granularity {args.granularity}"
                                                if args.granularity != "fine" else "")
    timing = planning_times(args.cache_dir)
    throughput = throughputs(args.cache_dir, args.granularity)
    transformer = transformer_units(args.cache_dir)
    result = {"timing": timing, "throughput": throughput, "transformer": transformer, "input_shape": SHAPE,
              "command": command, "transformer_command": command}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    page = markdown(timing, throughput, transformer_markdown(transformer, command), command, args.granularity)
    doc.write_text(page)
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
