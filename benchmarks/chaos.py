"""Chaos: kill or freeze devices of a training home at random moments; is the result still exact?

A synchronous pipeline that replays an interrupted sync-round from a
committed copy computes exactly what a run without the failure computes
(Asteroid §3.4, FTPipeHD §III-F). This benchmark tries that claim the way
devices really fail: each seeded trial trains a 4-device home (a 9-layer MLP
without batch-norm, real worker processes at host speed, 6 sync-rounds of 6
micro-batches, SGD with momentum, fault tolerance on, heartbeats every
0.1 s) and, while it trains,

- ``kill -9`` or ``SIGSTOP`` (never resumed) of a random device, either
  **aimed** at a random phase of its work (its K-th forward, backward or
  send, the all-reduce of a replicated stage, the optimizer step,
  replication, the global copy: :mod:`ecofl.pipeline.runtime.traps`) or at a
  **random wall-clock time** sent from outside the process;
- sometimes a ``SIGSTOP`` resumed with ``SIGCONT`` after 0.1-3 s (a pause);
- in about a third of the trials, a **second** device as well: at a random
  time, in the first recovery's migration, or as that recovery starts.

Three plans: 1F1B-Sync and GPipe over four single-device stages, and a hybrid
plan whose first stage is replicated on two devices. Each trial's final
weights are compared with single-process gradient accumulation over the same
mini-batches (the failure-free result; atol 1e-5). Reported: the fraction
of trials that completed, the fraction exact (by plan and by where the
failure struck), the sync-rounds lost (replayed from an older copy),
detection and recovery times (median and worst). Times are the host's, on a
shared 2-core machine: read them as orders of magnitude.

``python benchmarks/chaos.py [--trials 200] [--seed 0]`` prints the tables and
writes ``benchmarks/results/chaos.json`` and ``docs/chaos.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.markdown_section import replace_section  # noqa: E402
from ecofl.devices import DeviceSpec, HomePool  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402
from ecofl.net.liveness import LivenessSettings  # noqa: E402
from ecofl.pipeline.plan import Plan, StagePlan  # noqa: E402
from ecofl.pipeline.profile import profile_model  # noqa: E402
from ecofl.pipeline.runtime import HomePipeline, LayerList  # noqa: E402
from ecofl.pipeline.runtime.faults import FaultTolerance, Injection  # noqa: E402
from ecofl.train import accumulate_gradients  # noqa: E402
from ecofl.weights import get_weights, set_weights  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MLP = LayerList((
    ("Linear", {"in_features": 6, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 16}), ("Tanh", {}),
    ("Linear", {"in_features": 16, "out_features": 12}), ("Tanh", {}),
    ("Linear", {"in_features": 12, "out_features": 3}),
))
ROUNDS, MICRO, M = 6, 4, 6
LR, MOMENTUM, ATOL = 0.1, 0.9, 1e-5
HOST = DeviceSpec("host", speed=1.0, memory_bytes=1 << 30, bandwidth_bps=1e9)
HEARTBEAT = LivenessSettings(period_s=0.1, suspect_after_s=1.0, probe_timeout_s=1.0)
FOUR = ((0, 1), (2, 3), (4, 6), (7, 8))
PLANS = {
    "1f1b": Plan("chaos", tuple(StagePlan(layers, (d,), (MICRO,), 2 * (4 - d) - 1) for d, layers in enumerate(FOUR)),
                 MICRO, M, schedule="1f1b"),
    "gpipe": Plan("chaos", tuple(StagePlan(layers, (d,), (MICRO,), M) for d, layers in enumerate(FOUR)),
                  MICRO, M, schedule="gpipe"),
    "hybrid": Plan("chaos", (StagePlan((0, 3), (0, 1), (2, 2), 5), StagePlan((4, 6), (2,), (4,), 3),
                             StagePlan((7, 8), (3,), (4,), 1)), MICRO, M, schedule="1f1b"),
}
ROUND_PHASES = ("forward", "backward", "send", "step")


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(40, 6, generator=generator), torch.randint(0, 3, (40,), generator=generator)


def failure_free(plan: Plan, weights, x, y) -> list[np.ndarray]:
    """Sync-round r = gradient accumulation over its M micro-batches, then one SGD step (one process)."""
    model, _ = MLP.build()
    set_weights(model, weights)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for r in range(ROUNDS):
        index = (r * plan.batch_size + np.arange(plan.batch_size)) % len(x)
        accumulate_gradients(model, x[index], y[index], plan.num_micro_batches)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return get_weights(model)


@dataclasses.dataclass
class Trial:
    """What one trial does: the plan, and up to two failures (each aimed at a phase or at a time)."""

    plan: str
    failures: list[dict]  # {"signal": kill|freeze|pause, "device", and "phase"/"round"/"count" or "after_s"}

    def label(self) -> str:
        return " + ".join(f"{f['signal']} {f.get('phase') or 'random time'}" for f in self.failures)


def draw_trial(rng: random.Random, train_s: dict[str, float]) -> Trial:
    plan_name = rng.choice(sorted(PLANS))
    plan = PLANS[plan_name]
    devices = sorted({d for stage in plan.stages for d in stage.devices})
    first = rng.choice(devices)
    phases = list(ROUND_PHASES) + ["replicate", "global-copy"]
    if plan_name == "hybrid" and first in (0, 1):
        phases.append("allreduce")
    signal_name = rng.choices(["kill", "freeze", "pause"], weights=[6, 3, 1])[0]
    if signal_name != "pause" and rng.random() < 0.6:
        phase = rng.choice(phases)
        count = rng.randint(1, M) if phase in ROUND_PHASES else 1
        failures = [{"signal": signal_name, "device": first, "phase": phase, "round": rng.randint(1, ROUNDS - 2),
                     "count": count}]
    else:
        failures = [{"signal": signal_name, "device": first, "after_s": rng.uniform(0.0, train_s[plan_name])}]
        if signal_name == "pause":
            failures[0]["resume_after_s"] = rng.uniform(0.1, 3.0)
    if signal_name != "pause" and rng.random() < 0.35:
        second = rng.choice([d for d in devices if d != first])
        where = rng.choice(["random time", "migrate", "recover"])
        if where == "random time" or "phase" not in failures[0]:
            failures.append({"signal": "kill", "device": second, "after_s": rng.uniform(0.0, train_s[plan_name])})
        else:
            failures.append({"signal": "kill", "device": second, "phase": where, "round": failures[0]["round"],
                             "count": 1})
    return Trial(plan_name, failures)


def run_trial(trial: Trial, profile, x, y, expected: dict[str, list[np.ndarray]], start) -> dict:
    plan = PLANS[trial.plan]
    aimed = [Injection.parse(f"{f['signal']}:{f['device']}@{f['round']}:{f['phase']}:{f['count']}")
             for f in trial.failures if "phase" in f]
    timers = []
    record = {"plan": trial.plan, "failures": trial.failures, "label": trial.label()}
    began = time.time()
    try:
        ft = FaultTolerance(heartbeat=HEARTBEAT, global_copy_every=2)
        with HomePipeline(MLP, HomePool("chaos", (HOST,) * 4), plan, profile=profile, emulate="none",
                          timeout_s=60, fault_tolerance=ft) as home:
            pids = home.worker_pids
            for f in trial.failures:
                if "after_s" in f:
                    timers.extend(_timed_failure(pids[f["device"]], f))
            started = time.time()
            for timer in timers:
                timer.start()
            result = home.train(start, x, y, ROUNDS, lr=LR, momentum=MOMENTUM, inject=aimed)
            record["train_s"] = time.time() - started
    except Exception as error:  # noqa: BLE001 - a trial that did not complete is a result
        record.update(completed=False, error=f"{type(error).__name__}: {error}"[:300])
        traceback.print_exc(file=sys.stderr)
        return record
    finally:
        for timer in timers:
            timer.cancel()
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(expected[trial.plan], result.weights))
    events = [_timed_from_the_signal(e, trial.failures) for e in result.events]
    record.update(
        completed=result.rounds_completed == ROUNDS, max_abs_difference=difference, exact=difference <= ATOL,
        lost_rounds=result.lost_rounds, events=events, wall_s=time.time() - began,
        restored_from=sorted({r["source"] for e in events for r in e.get("restored_from", [])}),
    )
    return record


def _timed_from_the_signal(event: dict, failures: list[dict]) -> dict:
    """A failure the portal found (not injected) timed from when this benchmark really signalled the device,
    not from its last heartbeat: detection, resumption and recovery after the kill."""
    sent = next((f.get("sent_at") for f in failures if f["device"] == event["device"] and "after_s" in f), None)
    if event["kind"] != "failure" or sent is None or event.get("struck_at") is None:
        return event
    shift = event["struck_at"] - sent
    timed = {**event, "struck_at": sent}
    for key in ("detected_after_s", "resumed_after_s", "recovered_after_s"):
        if timed.get(key) is not None:
            timed[key] = timed[key] + shift
    return timed


def _timed_failure(pid: int, failure: dict) -> list[threading.Timer]:
    """Timers that signal ``pid`` from outside: kill -9, SIGSTOP, or SIGSTOP then SIGCONT (a pause)."""
    def send(signum: int) -> None:
        failure.setdefault("sent_at", time.time())
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass  # already gone (killed by the portal as lost)

    at = failure["after_s"]
    if failure["signal"] == "kill":
        return [threading.Timer(at, send, (signal.SIGKILL,))]
    timers = [threading.Timer(at, send, (signal.SIGSTOP,))]
    if failure["signal"] == "pause":
        timers.append(threading.Timer(at + failure["resume_after_s"], send, (signal.SIGCONT,)))
    return timers


def summarize(records: list[dict]) -> dict:
    def count(rows, key):
        return sum(bool(r.get(key)) for r in rows)

    def fraction(rows, key):
        return count(rows, key) / len(rows) if rows else None

    def times(key):
        values = [e[key] for r in records for e in r.get("events", []) if e.get(key) is not None
                  and e["kind"] in ("kill", "freeze", "failure")]
        return {"median": statistics.median(values), "worst": max(values), "n": len(values)} if values else None

    groups = {}
    for r in records:
        for key in (f"plan {r['plan']}", f"struck: {r['label']}"):
            groups.setdefault(key, []).append(r)
    return {
        "trials": len(records),
        "completed": fraction(records, "completed"),
        "exact": fraction(records, "exact"),
        "completed_trials": count(records, "completed"),
        "exact_trials": count(records, "exact"),
        "not_completed": [{"trial": i + 1, "label": r["label"], "error": r.get("error")}
                          for i, r in enumerate(records) if not r.get("completed")],
        "lost_rounds": sum(r.get("lost_rounds", 0) for r in records),
        "trials_with_lost_rounds": sum(1 for r in records if r.get("lost_rounds")),
        "from_global_copy": sum(1 for r in records if "global copy" in r.get("restored_from", [])),
        "detected_after_s": times("detected_after_s"),
        "resumed_after_s": times("resumed_after_s"),
        "recovered_after_s": times("recovered_after_s"),
        "by_group": {k: {"trials": len(v), "completed": count(v, "completed"), "exact": count(v, "exact"),
                         "lost_rounds": sum(r.get("lost_rounds", 0) for r in v)} for k, v in sorted(groups.items())},
    }


def markdown(summary: dict, meta: dict) -> str:
    def t(stat):
        return "-" if stat is None else f"{stat['median']:.2f} s / {stat['worst']:.2f} s"

    lines = [
        f"Measured {meta['date']} with `{meta['command']}` ({meta['minutes']:.1f} min; host speed, no emulation, "
        f"unshaped loopback links; machine load {meta['load']}).",
        "",
        "| trials | completed | exact (atol 1e-5) | sync-rounds lost (trials) | from the global copy | "
        "detection median / worst | resumed median / worst | first round after median / worst |",
        "|---:|---:|---:|---:|---:|---|---|---|",
        f"| {summary['trials']} | {summary['completed_trials']} ({summary['completed']:.1%}) | "
        f"{summary['exact_trials']} ({summary['exact']:.1%}) | {summary['lost_rounds']} "
        f"({summary['trials_with_lost_rounds']}) | {summary['from_global_copy']} | {t(summary['detected_after_s'])} "
        f"| {t(summary['resumed_after_s'])} | {t(summary['recovered_after_s'])} |",
        "",
        "| plan, or where the failures struck | trials | completed | exact | sync-rounds lost |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, group in summary["by_group"].items():
        lines.append(f"| {key} | {group['trials']} | {group['completed']} | {group['exact']} "
                     f"| {group['lost_rounds']} |")
    for failure in summary["not_completed"]:
        lines.append(f"\nTrial {failure['trial']} ({failure['label']}) did not complete: {failure['error']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--minutes", type=float, default=None, help="stop drawing trials after this long")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "chaos.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs" / "chaos.md"))
    args = parser.parse_args(argv)
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: the trial's workers are stopped
        return run(args, argv)


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    torch.manual_seed(0)
    _, layers = MLP.build()
    profile = profile_model(layers, (6,), name="chaos-mlp")
    x, y = data()
    model, _ = MLP.build()
    start = get_weights(model)
    expected = {name: failure_free(plan, start, x, y) for name, plan in PLANS.items()}
    train_s = {}
    for name, plan in PLANS.items():  # how long a failure-free run takes: random-time failures land inside it
        with HomePipeline(MLP, HomePool("chaos", (HOST,) * 4), plan, profile=profile, emulate="none", timeout_s=60,
                          fault_tolerance=FaultTolerance(heartbeat=HEARTBEAT, global_copy_every=2)) as home:
            began = time.time()
            result = home.train(start, x, y, ROUNDS, lr=LR, momentum=MOMENTUM)
            train_s[name] = time.time() - began
        difference = max(float(np.max(np.abs(a - b))) for a, b in zip(expected[name], result.weights))
        print(f"failure-free {name}: {train_s[name]:.2f} s, max abs difference {difference:.1e}", flush=True)
    rng = random.Random(args.seed)
    records = []
    began = time.time()
    try:
        for i in range(args.trials):
            if args.minutes is not None and time.time() - began > 60 * args.minutes:
                break
            trial = draw_trial(rng, train_s)
            record = run_trial(trial, profile, x, y, expected, start)
            records.append(record)
            status = ("exact" if record.get("exact") else f"DIFFERS {record.get('max_abs_difference'):.1e}"
                      if record.get("completed") else f"FAILED {record.get('error')}")
            print(f"[{i + 1}/{args.trials}] {trial.plan:6s} {trial.label():40s} {status}", flush=True)
    except KeyboardInterrupt:  # Ctrl-C or kill: the trials done so far are still reported
        print(f"interrupted after {len(records)} trials", flush=True)
    if not records:
        return 130
    summary = summarize(records)
    meta = {"date": time.strftime("%Y-%m-%d"),
            "command": "python benchmarks/chaos.py " + " ".join(argv or sys.argv[1:]),
            "minutes": (time.time() - began) / 60, "load": " ".join(f"{v:.1f}" for v in os.getloadavg()),
            "failure_free_train_s": train_s}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "summary": summary, "trials": records}, indent=1))
    table = markdown(summary, meta)
    print(table)
    if not replace_section(Path(args.doc), table):
        print(f"(no benchmark section in {args.doc}; table not written there)")
    return 0 if summary["completed"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
