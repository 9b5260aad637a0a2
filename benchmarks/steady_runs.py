"""Do confined runs repeat, what does safety cost, and how fast does a home resume after a kill? All on one
calibration.

Issue 43: two runs of ``ecofl home train --emulate cgroup`` each calibrated
afresh and planned on what they measured, so the same command predicted 4.93
and then 4.34 s per sync-round and measured 5.5 and then 4.0 s, and a
comparison of two runs moved with the calibration. Here every run shares one
``--calibration FILE`` (a first run measures and writes it, the others
reuse its speeds and plan): the runs differ only by the machine's noise and
by the factor compared. The first run is not compared: its workers start
training warm from calibrating (its first round took 4.8 s where the
others' took 7.8-8.2, 2026-12-03 03:31), so a plain run beside it looked
faster than the plain runs after it. Reported:

- each run's measured and predicted sync-round (median of its rounds) and the
  plain runs' spread;
- what fault tolerance (heartbeats, replication every sync-round while it
  computes, a global copy every 5, also while a round computes) costs: runs
  with it alternate with plain runs, and each run's mean over all its
  sync-rounds (the round that carries the global copy too, which a median
  would leave out) is compared with the plain runs' either side; then the
  same over its rounds from the third on (:data:`STEADY_FROM`), once the
  buffers of the replicas it holds were mapped (what a long training pays
  every round); each as the mean over the runs with its standard error (a
  run's rounds move by a few per cent on this host, so a cost of a few per
  cent needs several pairs to tell from none);
- ``--kills`` runs with ``--inject kill:2@4``: detection, kill to resumed (the
  next sync-round sent), kill to the first completed round, and that round's
  own time (the replayed round on the survivors' plan, beside its prediction);
- each stage's CPU a sync-round, and the part of it that is not the stage's
  own thread (sending, receiving, replicas, heartbeats);
- after each plain run, the devices timing their stages alone again, as
  they calibrated, and the plan predicted on those speeds
  (:func:`timed_again`): where the runs move and these predictions move
  with them, the devices themselves moved; where the runs move alone, it is
  something in the pipeline's runs;
- the host's own speed before each run (:func:`host_reference_s`: the CPU
  seconds of one fixed piece of work): on a shared virtual machine it moves
  by itself, and a run that is slower than its neighbours on a slower host
  says nothing about the runtime; and during each run's rounds, from a
  probe timing a small fixed piece of work beside them every 0.25 s
  (:mod:`benchmarks.host_probe`; its samples over the run's last seconds, as
  many as its rounds took: the rounds end a run);
- each run's seconds a sync-round per CPU-second of the busiest device's
  stage thread (:func:`round_per_stage_cpu`), and fault tolerance's cost
  in it. A device's quota is CPU time, so on a host that is slower during
  a run (each operation costing more CPU) the same plan's rounds last
  longer; the stage thread does the same work in every run of the plan, so
  its CPU a round gauges the host during the run itself, where the
  reference is taken before it. Both figures are measured; the per-CPU
  cost leaves out what fault tolerance would add to the stage thread's own
  CPU (it would be counted as a slower host), so it is given beside the
  plain cost, not instead of it.

``python benchmarks/steady_runs.py [--pairs 3] [--kills 2] [--rounds 6]`` (``--table-from JSON``: only the table)
writes ``benchmarks/results/steady_runs.json`` and a table in
``docs/pipeline.md``. Run it with the machine otherwise idle: the load is given.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.host_probe import HostProbe  # noqa: E402
from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.allocator import keep_freed_memory  # noqa: E402
from ecofl.cli.calibration_file import load_calibration  # noqa: E402
from ecofl.names import BACKUP_RULES  # noqa: E402
from ecofl.pipeline.profile import profile_zoo_model  # noqa: E402
from ecofl.pipeline.runtime import ZooModel  # noqa: E402
from ecofl.pipeline.runtime.calibration import confine_pool  # noqa: E402
from ecofl.pipeline.runtime.prediction import predict_sync_round  # noqa: E402
from ecofl.pools import load_pool  # noqa: E402

COMMAND = ["home", "train", "--model", "mobilenet_v2", "--pool", "ecofl-3stage", "--dataset", "fashion_mnist",
           "--emulate", "cgroup", "--json"]
KILL = "kill:2@4"  # device 2 killed as sync-round 4 starts
SHAPE, CLASSES = (1, 28, 28), 10  # Fashion-MNIST's, as COMMAND trains
#: The first sync-round of a run's steady state: a backup maps the two replicas it holds of a stage in its first two
#: rounds, and from the third on the copies a round drops are meant to give their memory to the next
#: (:mod:`ecofl.pipeline.runtime.spare_blocks`; 2026-12-03 03:40 a device still mapped 5-10 MiB more in round 3).
STEADY_FROM = 2


def host_reference_s(repeats: int = 5) -> float:
    """The host's speed now: the median CPU seconds of one fixed convolution workload on one thread (the same
    work every time; on this 2-core VM it took 0.17-0.43 s over an hour once, and 0.045-0.141 s on 2026-12-03).
    The caller's torch threads are kept; this process keeps freed memory from here on, as a worker does
    (:func:`~ecofl.allocator.keep_freed_memory`): without it, the work's fresh blocks were faulted in on every
    call in some processes and not in others (:mod:`benchmarks.host_probe`), and before 2026-12-05 18:10 this
    sweep's process read 0.070-0.080 s where confined.py's, which keeps them, read 0.034-0.040 s that hour."""
    import torch

    keep_freed_memory()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        generator = torch.Generator().manual_seed(0)
        x, conv = torch.randn(16, 32, 56, 56, generator=generator), torch.nn.Conv2d(32, 32, 3, padding=1)
        times = []
        for _ in range(repeats):
            start = time.thread_time()
            with torch.no_grad():
                for _ in range(4):
                    conv(x)
            times.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    return sorted(times)[len(times) // 2]


def train(rounds: int, calibration: Path, fault_tolerance: bool, inject: str | None = None,
          backups: str = BACKUP_RULES[0]) -> dict:
    """One run: its sync-round measured and predicted, its fault events, the load before it and its wall time
    (``backups``: where a fault-tolerant run backs a middle stage up, ``--backups``)."""
    load, reference = os.getloadavg()[0], host_reference_s()
    start = time.monotonic()
    command = [sys.executable, "-m", "ecofl", *COMMAND, "--rounds", str(rounds), "--calibration", str(calibration)]
    command += ["--fault-tolerance", "--backups", backups] if fault_tolerance else []
    command += ["--inject", inject] if inject else []
    with HostProbe() as probe:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    ended = time.monotonic()
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-3000:]}")
    report = json.loads(done.stdout)
    rounds_s = report["sync_rounds_s"]
    return {"fault_tolerance": fault_tolerance, "inject": inject, "sync_round_s": report["sync_round_s"],
            **({"backups": backups} if fault_tolerance else {}),
            "mean_round_s": sum(rounds_s) / len(rounds_s),
            "steady_mean_round_s": sum(rounds_s[STEADY_FROM:]) / len(rounds_s[STEADY_FROM:]),
            "predicted_sync_round_s": report["predicted_sync_round_s"],
            "error": report["sync_round_s"] / report["predicted_sync_round_s"] - 1,
            "sync_rounds_s": report["sync_rounds_s"], "events": report["events"],
            "first_touched_mib_by_round": report["first_touched_mib_by_round"],
            "predicted_first_round_s": report["predicted_first_round_s"],
            "stages": [s["layers"] for s in report["stages"]], "rounds_completed": report["rounds_completed"],
            "cpu_s_per_round": [s["cpu_s_per_round"] for s in report["stages"]],
            "cpu_s_per_round_by_job": [s["cpu_s_per_round_by_job"] for s in report["stages"]],
            "busy_fraction": [s["busy_fraction"] for s in report["stages"]],
            "predicted_busy_fraction": [s["predicted_busy_fraction"] for s in report["stages"]],
            "devices": report["devices"],  # the speeds planned on (the calibration's) and how CFS held each
            "host_reference_s": round(reference, 4), "load_before": round(load, 2),
            "host_probe": probe.summary(since=ended - sum(rounds_s)),  # about the rounds: they end the run
            "wall_s": round(time.monotonic() - start, 1)}


def timed_again(calibration: Path) -> dict:
    """Each device times the work its kept speed was measured on again, now, alone in its cgroup as it
    calibrated; with the kept plan's sync-round predicted on those speeds (without fault tolerance's copies), as
    the CLI predicts a plain run on the kept ones."""
    settings = json.loads(calibration.read_text())["settings"]
    presets = load_pool(settings["pool"], settings["bandwidth"])
    kept, plan, _ = load_calibration(calibration, settings, presets)
    profile = profile_zoo_model(settings["model"], SHAPE, CLASSES, settings["granularity"])
    spec = ZooModel(settings["model"], SHAPE, CLASSES, settings["granularity"])
    again = confine_pool(spec, SHAPE, profile, presets, kept.workload)
    return {"speeds": [device.speed for device in again.pool.devices],
            "predicted_sync_round_s": predict_sync_round(plan, profile, again.pool, "cgroup").sync_round_s}


def _not_the_stages_thread(run: dict) -> list[float | None]:
    """Each stage's CPU a sync-round outside its own thread (``MainThread``): links, replicas, heartbeats."""
    return [None if cpu is None else cpu - jobs.get("MainThread", 0.0)
            for cpu, jobs in zip(run["cpu_s_per_round"], run["cpu_s_per_round_by_job"])]


def busiest_stage(run: dict) -> int:
    """The stage ``run``'s own prediction keeps busiest."""
    busy = run["predicted_busy_fraction"]
    return max(range(len(busy)), key=busy.__getitem__)


def plain_busiest_stage(runs: list[dict]) -> int:
    """The stage the plain runs' plan is predicted to keep busiest: one device for every run of the plan (a
    fault-tolerant run's prediction adds its copies' time and may name another)."""
    plain = [r for r in runs[1:] if not r["fault_tolerance"]]
    if not plain:
        raise ValueError("no plain run after the calibrating one: nothing to gauge the plan's runs by")
    return busiest_stage(plain[0])


def round_per_stage_cpu(run: dict, stage: int) -> float:
    """A run's mean sync-round over the CPU seconds a round of ``stage``'s thread (``MainThread``)."""
    return run["mean_round_s"] / run["cpu_s_per_round_by_job"][stage]["MainThread"]


def spread(values: list[float]) -> float:
    """How far apart ``values`` are: the largest over the smallest, less one."""
    return max(values) / min(values) - 1


def summary(runs: list[dict], pairs: int) -> dict:
    """The plain runs' spread (the first run calibrated and is not compared), of their sync-rounds and of their
    seconds a round per stage-thread CPU-second (the host's speed during each run factored out); and each
    fault-tolerant run's cost against the plain runs either side (runs 2, 4, ... of the ``pairs`` alternating
    with plain runs 1, 3, ...): of its mean of all rounds, of its rounds from :data:`STEADY_FROM` on, and per
    stage-thread CPU-second."""
    plain = [r for r in runs[1:] if not r["fault_tolerance"]]
    busiest = plain_busiest_stage(runs)

    def per_stage_cpu(run: dict) -> float:
        return round_per_stage_cpu(run, busiest)

    def costs_by(figure) -> list[float]:
        return [figure(runs[i]) / ((figure(runs[i - 1]) + figure(runs[i + 1])) / 2) - 1
                for i in range(2, 2 * pairs + 2, 2)]

    costs = {"": costs_by(lambda r: r["mean_round_s"]), "_steady": costs_by(lambda r: r["steady_mean_round_s"]),
             "_per_stage_cpu": costs_by(per_stage_cpu)}
    result = {"plain_spread": spread([r["sync_round_s"] for r in plain]),
              "plain_spread_per_stage_cpu": spread([per_stage_cpu(r) for r in plain])}
    alone = [r["timed_after"]["predicted_sync_round_s"] for r in plain if "timed_after" in r]
    if len(alone) == len(plain):  # runs of a version of this script that timed the devices again
        result["plain_spread_timed_after"] = spread(alone)
    if all(_probed(r) is not None for r in runs[1:]):  # runs of a version of this script with the host probe
        result["plain_spread_host_probe"] = spread([_probed(r) for r in plain])
        with contextlib.suppress(statistics.StatisticsError):  # a probe constant over the runs: no correlation
            if len(plain) >= 3:  # two points always correlate fully
                result["plain_host_probe_correlation"] = statistics.correlation([_probed(r) for r in plain],
                                                                                [r["sync_round_s"] for r in plain])
        result["fault_tolerance_host_probe"] = costs_by(_probed)
    for suffix, values in costs.items():
        result[f"fault_tolerance{suffix}_costs"] = values
        result[f"fault_tolerance{suffix}_cost"] = sum(values) / len(values) if values else None
    return result


def _probed(run: dict) -> float | None:
    """The host probe's median CPU seconds for its work during ``run``'s rounds (``None``: not probed)."""
    return run.get("host_probe", {}).get("median_s")


def _probe_sentence(result: dict) -> str:
    """The host probe's spread over the plain runs, its correlation with them and each fault-tolerant run's
    probe against its neighbours (empty for a sweep without the probe or without fault-tolerant runs)."""
    if "plain_spread_host_probe" not in result or not result["fault_tolerance_host_probe"]:
        return ""
    correlation = result.get("plain_host_probe_correlation")
    return (f" The host probe's work during the plain runs' rounds within {result['plain_spread_host_probe']:.1%} "
            "of each other" + ("" if correlation is None else f", its correlation with their sync-rounds "
                               f"{correlation:+.2f}")
            + "; during each fault-tolerant run's against the plain runs' either side: "
            f"{_costs(result['fault_tolerance_host_probe'])}.")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _timed_after(run: dict) -> str:
    """The plan predicted on the speeds the devices measured alone right after ``run``, and that against the
    run's own prediction (``-``: not timed)."""
    after = run.get("timed_after")
    if after is None:
        return "-"
    predicted = after["predicted_sync_round_s"]
    return f"{predicted:.2f} ({predicted / run['predicted_sync_round_s'] - 1:+.1%})"


def _stages(values: list[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" for v in values)


def kill_figures(run: dict) -> dict:
    """Kill to detected, to resumed and to the first completed round, and that round's own time: the round
    replayed from the version restored, on the survivors' plan, with the round after it and the memory each
    mapped for the first time; the replayed round's prediction is the survivors' first round's (their sync-round
    and the memory their new stages map, :mod:`ecofl.pipeline.first_touch`), beside their sync-round's."""
    [event] = run["events"]
    replayed = event["round"] - event["lost_rounds"]
    touched = run["first_touched_mib_by_round"]
    return {"detected_s": event["detected_after_s"], "stopping_s": event["stopping_s"],
            "resumed_s": event["resumed_after_s"],
            "first_round_after_s": event["recovered_after_s"], "lost_rounds": event["lost_rounds"],
            "replayed_round_s": run["sync_rounds_s"][replayed],
            "replayed_round_predicted_s": run["predicted_first_round_s"],
            "predicted_sync_round_s": run["predicted_sync_round_s"],
            "round_after_s": run["sync_rounds_s"][replayed + 1] if replayed + 1 < len(touched) else None,
            "first_touched_mib": touched[replayed : replayed + 2],
            "rescheduling_s": event["rescheduling_s"], "bytes_moved": event["bytes_moved"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs with fault tolerance, each between plain runs")
    parser.add_argument("--kills", type=int, default=2, help="runs with --inject kill:2@4 (at least 6 rounds)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--backups", choices=BACKUP_RULES, default=BACKUP_RULES[0],
                        help="where the fault-tolerant runs back a middle stage up (ecofl home train --backups)")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "steady_runs.json",
                        help="the results file to write")
    parser.add_argument("--section", default="steady_runs", help="docs/pipeline.md's marked section for the table")
    parser.add_argument("--table-from", type=Path, metavar="JSON",
                        help="run nothing: the summary and table of a results file this script wrote before "
                             "(its summary is written again, its runs kept)")
    args = parser.parse_args()
    if args.table_from is not None:
        path = args.table_from
        result = json.loads(path.read_text())
        result.update(summary(result["runs"], len(result["fault_tolerance_costs"])))
    else:
        path = args.json
        result = measure(args.pairs, args.kills, args.rounds, args.backups)
        result["command"] = " ".join(["python", "benchmarks/steady_runs.py", *sys.argv[1:]])  # as it was run
    publish(result, path, render(result), ROOT / "docs" / "pipeline.md", args.section)
    return 0


def measure(pairs: int, kills: int, rounds: int, backups: str = BACKUP_RULES[0]) -> dict:
    """Two plain runs (the first calibrates), ``pairs`` fault-tolerant runs each followed by a plain one, then
    ``kills`` runs with :data:`KILL`, the fault-tolerant ones backing up as ``backups`` says; the results file's
    content."""
    with tempfile.TemporaryDirectory() as work:
        calibration = Path(work) / "calibration.json"
        order = [(False, None)] * 2 + [(True, None), (False, None)] * pairs + [(True, KILL)] * kills
        runs = []
        for i, (tolerant, inject) in enumerate(order):
            print(f"run {i + 1} of {len(order)}{' (fault tolerance)' if tolerant else ''} {inject or ''}...",
                  flush=True)
            runs.append(train(max(rounds, 8) if inject else rounds, calibration, tolerant, inject, backups))
            if not tolerant:  # the devices alone, right after the run: did they move, or the pipeline?
                runs[-1]["timed_after"] = timed_again(calibration)
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "events"}), flush=True)
    return {
        "command": f"python benchmarks/steady_runs.py --pairs {pairs} --kills {kills} --rounds {rounds}"
                   + (f" --backups {backups}" if backups != BACKUP_RULES[0] else ""),  # main() says how it was run
        "runs_of": "ecofl " + " ".join(COMMAND) + f" --rounds {rounds} --calibration FILE",
        "backups": backups,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
        "runs": runs,
        **summary(runs, pairs),
        "kills": [kill_figures(r) for r in runs if r["inject"]],
    }


def render(result: dict) -> str:
    """The Markdown of a results file: every run, the spread and costs, and the kills."""
    runs, kills = result["runs"], result["kills"]
    costs, steady_costs = result["fault_tolerance_costs"], result["fault_tolerance_steady_costs"]
    per_cpu = result["fault_tolerance_per_stage_cpu_costs"]
    busiest = plain_busiest_stage(runs)  # a kill's runs end on another plan: their own busiest stage
    backups = f" --backups {result['backups']}" if "backups" in result else ""  # files from before the option
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']}: each run is "
        f"`{result['runs_of']}` (`--fault-tolerance{backups}`, `--inject {KILL}` where said), all on one calibration "
        "(run 1 measures and writes it, and is not compared: its workers start warm from calibrating).",
        "",
        "| run | fault tolerance | sync-round s (median) | predicted s | error | mean of all rounds s | mean from "
        f"round {STEADY_FROM + 1} s | CPU s a sync-round (stages) | of it not the stage's thread | s a round per "
        "stage-thread CPU-s (busiest) | host reference s | host probe ms | load before | predicted on the devices "
        "timed after it s |",
        "|---:|---|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|",
        *(f"| {i + 1} | {'on' if r['fault_tolerance'] else 'off'}{', ' + r['inject'] if r['inject'] else ''} | "
          f"{r['sync_round_s']:.2f} | {r['predicted_sync_round_s']:.2f} | {r['error']:+.1%} | "
          f"{r['mean_round_s']:.2f} | {r['steady_mean_round_s']:.2f} | "
          f"{_stages(r['cpu_s_per_round'])} | {_stages(_not_the_stages_thread(r))} | "
          f"{round_per_stage_cpu(r, busiest_stage(r) if r['inject'] else busiest):.2f} | "
          f"{r['host_reference_s']:.3f} | {'-' if _probed(r) is None else f'{1000 * _probed(r):.2f}'} | "
          f"{r['load_before']} | {_timed_after(r)} |" for i, r in enumerate(runs)),
        "",
        f"Plain runs' medians (runs 2 on) within {result['plain_spread']:.1%} of each other; their seconds a "
        f"round per CPU-second of the busiest device's stage thread (the host's speed during each run factored out) "
        f"within {result['plain_spread_per_stage_cpu']:.1%}"
        + (f"; predicted on the speeds their devices measured alone right after each, within "
           f"{result['plain_spread_timed_after']:.1%}" if "plain_spread_timed_after" in result else "") + "."
        + (f" Fault tolerance, each run's mean of all rounds against the plain runs' either side: "
           f"{_costs(costs)}; of its rounds from round {STEADY_FROM + 1} on: {_costs(steady_costs)}; "
           f"per CPU-second of the busiest device's stage thread: {_costs(per_cpu)}." if costs else "")
        + _probe_sentence(result),
    ]
    if kills:
        lines += ["", "| kill run | detected s | survivors stopped s | re-scheduling s | resumed s | first round "
                      "after s | its round s (predicted) | the next round s (predicted) | first-touched MiB "
                      "(its, next) "
                      "| lost rounds | bytes moved |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {i + 1} | {k['detected_s']:.2f} | {k['stopping_s']:.2f} | {k['rescheduling_s']:.2f} | "
                  f"{k['resumed_s']:.2f} | {k['first_round_after_s']:.2f} | {k['replayed_round_s']:.2f} "
                  f"({_seconds(k['replayed_round_predicted_s'])}) | {_seconds(k['round_after_s'])} "
                  f"({k['predicted_sync_round_s']:.2f}) | "
                  f"{', '.join(f'{m:.0f}' for m in k['first_touched_mib'] if m is not None)} | {k['lost_rounds']} | "
                  f"{k['bytes_moved']} |" for i, k in enumerate(kills)]
    return "\n".join(lines)


def standard_error(values: list[float]) -> float | None:
    """The standard error of ``values``' mean (None for fewer than two): how far the mean of so few runs on a
    noisy host may be from what more runs would give."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def _costs(values: list[float]) -> str:
    error = standard_error(values)
    spread = "" if error is None else f", standard error {error:.1%}"
    return f"{', '.join(f'{c:+.1%}' for c in values)} (mean {sum(values) / len(values):+.1%}{spread})"


if __name__ == "__main__":
    sys.exit(main())
