"""Scaling of the Flower simulation in the number of homes and in the number of Ray actors (docs/scale.md).

    .venv/bin/python -m benchmarks.scale                        # 1,000 / 10,000 / 30,000 / 100,000 homes, 1/2/4 actors
    .venv/bin/python -m benchmarks.scale --homes 1000 10000 --actors 2

Each point is one run of the real entry point in a subprocess,
``python -m simulations.run homes=N loop.max_updates=U train.epochs=1
partition.samples_per_client=60`` (every home draws 60 Fashion-MNIST images
of two classes, so all sizes have the same homes and 100,000 homes fit on
60,000 images), while :class:`~benchmarks.process_tree.TreeMemory` samples
the PSS and RSS of its whole process tree (driver, Ray's processes, actors)
every 0.5 s. ``server.connect_timeout_s`` is ``--connect-timeout`` (an hour),
so that every home answers even on a busy machine. From the run's ``timing.json`` and ``summary.json``:

* **start-up**: seconds from ``simulate()`` (dataset, Ray, the connect
  query of every home, grouping) to the first group round sent, and per home;
* **server s / update**: the seconds after start-up not spent waiting for
  training replies, per global update (the event loop, evaluation, metrics,
  re-grouping), and the evaluation's share of it;
* **client updates / s**: training replies per second after start-up;
* **peak PSS / RSS**: of the whole process tree.

Before the runs it measures what sharing the decoded dataset saves: two
processes that load Fashion-MNIST, with the machine's decoded copy and with
their own (:func:`data_sharing`).

The actor sweep runs ``--sweep-homes`` homes with 1, 2, 4 actors on this
machine's 2 cores, FedAvg rounds of 20 homes evaluated only at the end
(:data:`SWEEP`), and reports client updates per second. The load average
(``os.getloadavg``) is recorded before and after every run: the machine is
shared. Writes ``benchmarks/results/scale.json``, prints the tables, puts
them into docs/scale.md's measured section and draws ``docs/scale.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.markdown_section import replace_section
from benchmarks.process_tree import TreeMemory

ROOT = Path(__file__).resolve().parents[1]
#: The actor sweep: FedAvg rounds of 20 homes (as many trainings at once as there are actors to run them),
#: the global model evaluated once at the end, so the figure is the homes' throughput and not the server's.
SWEEP = ("strategy=fedavg", "loop.max_concurrent=20", "loop.eval_every=1000")


def run_point(homes: int, actors: int, updates: int, samples: int, out_dir: Path, timeout_s: float,
              connect_timeout_s: float, overrides: tuple[str, ...] = ()) -> dict:
    """One simulation run (``overrides``: more Hydra overrides); its figures."""
    command = [
        sys.executable, "-m", "simulations.run", f"homes={homes}", f"loop.max_updates={updates}", "train.epochs=1",
        f"partition.samples_per_client={samples}", f"simulation.actors={actors}", "plot=false",
        "server.eval_samples=1000", f"server.connect_timeout_s={connect_timeout_s:g}", f"hydra.run.dir={out_dir}",
        *overrides,
    ]
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    with open(out_dir.with_suffix(".log"), "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        with TreeMemory(root=process.pid) as memory:
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:  # as Ctrl-C: the run writes what it has and stops Ray
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    seconds = time.monotonic() - started
    point = {"homes": homes, "actors": actors, "exit": process.returncode, "seconds": seconds,
             "load_before": load_before, "load_after": os.getloadavg()[0],
             "peak_pss_mb": memory.peak_pss / 2**20, "peak_rss_mb": memory.peak_rss / 2**20,
             "processes_at_peak": [{"process": name, "pss_mb": pss / 2**20} for name, pss in memory.at_peak[:8]]}
    if process.returncode != 0 or not (out_dir / "timing.json").is_file():
        return point
    timing = json.loads((out_dir / "timing.json").read_text())
    summary = json.loads((out_dir / "summary.json").read_text())
    after_startup = timing["wall_s"] - timing["startup_s"]
    updates_done = max(1, summary["updates"])
    point.update(
        updates=summary["updates"], homes_answered=summary["homes_answered"],
        startup_s=timing["startup_s"], startup_ms_per_home=1000 * timing["startup_s"] / homes,
        connect_s=timing["connect_s"],
        server_s_per_update=(after_startup - timing["train_wall_s"]) / updates_done,
        evaluation_s_per_update=timing["evaluation_s"] / updates_done,
        client_updates=timing["train_replies"], client_updates_per_s=timing["train_replies"] / after_startup,
        home_train_s=timing["home_train_s"], train_wall_s=timing["train_wall_s"],
    )
    return point


#: A process that loads Fashion-MNIST as an actor does, touches every image, says so and waits.
LOADER = ("import sys; from ecofl.data import load_dataset; d = load_dataset('fashion_mnist'); "
          "float(d.train.x.sum()); print('loaded', flush=True); sys.stdin.read()")


def data_sharing(processes: int = 2) -> dict:
    """PSS (MB) of ``processes`` processes holding Fashion-MNIST: mapped from the machine's decoded copy, and
    each decoding its own (the cache directory unwritable)."""
    result = {}
    for mode, cache in (("shared", os.environ.get("ECOFL_CACHE_DIR") or str(Path("~/.cache/ecofl").expanduser())),
                        ("own_copy", "/proc/ecofl-unwritable")):
        children = [subprocess.Popen([sys.executable, "-c", LOADER], cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "ECOFL_CACHE_DIR": cache}) for _ in range(processes)]
        try:
            for child in children:
                child.stdout.readline()
            result[mode] = [_pss_mb(child.pid) for child in children]
        finally:
            for child in children:
                child.stdin.close()
                child.wait(timeout=60)
    return result


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def growth(points: list[dict], key: str) -> str:
    """How ``key`` grows from the smallest to the largest run: the ratio against the ratio of homes."""
    ok = [p for p in points if key in p]
    if len(ok) < 2:
        return "-"
    first, last = ok[0], ok[-1]
    return f"x{last[key] / first[key]:.2f} for x{last['homes'] / first['homes']:.0f} homes"


def markdown(result: dict) -> str:
    lines = [f"Measured {result['date']} on {result['cpus']} cores shared with other work (load average before "
             "and after each run in the table); one run per row.", "",
             "| homes | answered | start-up (s) | per home (ms) | connect (s) | server s / update | of it evaluation | "
             "client updates / s | peak PSS (MB) | peak RSS sum (MB) | load before/after |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for p in result["homes"]:
        if "startup_s" not in p:
            lines.append(f"| {p['homes']:,} | | failed (exit {p['exit']}) after {p['seconds']:.0f} s | | | | | | "
                         f"{p['peak_pss_mb']:.0f} | {p['peak_rss_mb']:.0f} | "
                         f"{p['load_before']:.1f}/{p['load_after']:.1f} |")
            continue
        lines.append(
            f"| {p['homes']:,} | {p['homes_answered']:,} | {p['startup_s']:.1f} | {p['startup_ms_per_home']:.2f} | "
            f"{p['connect_s']:.1f} | "
            f"{p['server_s_per_update']:.2f} | {p['evaluation_s_per_update']:.2f} | {p['client_updates_per_s']:.2f} | "
            f"{p['peak_pss_mb']:.0f} | {p['peak_rss_mb']:.0f} | {p['load_before']:.1f}/{p['load_after']:.1f} |")
    points = result["homes"]
    lines += ["", f"Growth from the first to the last row: start-up {growth(points, 'startup_s')}, "
              f"peak PSS {growth(points, 'peak_pss_mb')}, server s / update {growth(points, 'server_s_per_update')}.",
              ""]
    if result.get("data_sharing"):
        shared, own = result["data_sharing"]["shared"], result["data_sharing"]["own_copy"]
        lines += [f"Fashion-MNIST in {len(shared)} processes (each loads it as an actor does and reads every image): "
                  f"{sum(shared):.0f} MB PSS in all when mapped from the machine's decoded copy, {sum(own):.0f} MB "
                  "when each decodes its own.", ""]
    if result["actors"]:
        lines += [f"Client updates per second against Ray actors ({result['sweep_homes']:,} homes, FedAvg rounds of "
                  "20 homes, 1 local epoch, the global model evaluated at the end only):",
                  "", "| actors | client updates / s | peak PSS (MB) | load before/after |", "|---:|---:|---:|---|"]
        for p in result["actors"]:
            rate = f"{p['client_updates_per_s']:.2f}" if "client_updates_per_s" in p else f"failed (exit {p['exit']})"
            lines.append(f"| {p['actors']} | {rate} | {p['peak_pss_mb']:.0f} | "
                         f"{p['load_before']:.1f}/{p['load_after']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [p for p in result["homes"] if "startup_s" in p]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    homes = [p["homes"] for p in points]
    axes[0].plot(homes, [p["startup_ms_per_home"] for p in points], "o-")
    axes[0].set(xscale="log", xlabel="homes", ylabel="start-up per home (ms)", title="start-up per home")
    axes[1].plot(homes, [p["peak_pss_mb"] for p in points], "o-", label="PSS")
    axes[1].plot(homes, [p["peak_rss_mb"] for p in points], "s--", label="RSS sum")
    axes[1].set(xscale="log", xlabel="homes", ylabel="MB", title="peak memory of the process tree")
    axes[1].legend()
    sweep = [p for p in result["actors"] if "client_updates_per_s" in p]
    axes[2].plot([p["actors"] for p in sweep], [p["client_updates_per_s"] for p in sweep], "o-")
    axes[2].set(xlabel="Ray actors (2 cores)", ylabel="client updates / s", title="throughput vs actors")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--homes", type=int, nargs="*", default=[1000, 10000, 30000, 100000])
    parser.add_argument("--actors", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--sweep-homes", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--sweep-updates", type=int, default=12)
    parser.add_argument("--samples-per-home", type=int, default=60)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is stopped")
    parser.add_argument("--connect-timeout", type=float, default=3600.0,
                        help="server.connect_timeout_s: long enough for every home to answer on a busy machine")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/scale.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs/scale.md")
    parser.add_argument("--update", action="store_true",
                        help="keep the other runs in --json and replace only the ones measured now (to repeat a "
                             "disturbed measurement)")
    args = parser.parse_args()
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "sweep_homes": args.sweep_homes,
              "homes": [], "actors": []}
    if args.update and args.json.is_file():
        result = json.loads(args.json.read_text())
        result["homes"] = [p for p in result["homes"] if p["homes"] not in args.homes]
        result["actors"] = [p for p in result["actors"] if p["actors"] not in args.actors]
    result["data_sharing"] = data_sharing()
    runs = [("homes", homes, 2, args.updates, ()) for homes in args.homes]
    runs += [("actors", args.sweep_homes, actors, args.sweep_updates, SWEEP) for actors in args.actors]
    with tempfile.TemporaryDirectory(prefix="ecofl-scale-") as tmp:
        for kind, homes, actors, updates, overrides in runs:
            point = run_point(homes, actors, updates, args.samples_per_home, Path(tmp) / f"{kind}{homes}-{actors}",
                              args.timeout, args.connect_timeout, overrides)
            result[kind].append(point)
            print(json.dumps(point), flush=True)
            write(result, args)  # after every run: a long sweep stopped halfway keeps what it measured
    write(result, args)


def write(result: dict, args: argparse.Namespace) -> None:
    result = {**result, "homes": sorted(result["homes"], key=lambda p: p["homes"]),
              "actors": sorted(result["actors"], key=lambda p: p["actors"])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    table = markdown(result)
    replace_section(args.doc, table)
    plot(result, args.doc.with_suffix(".png"))
    print(table, flush=True)


if __name__ == "__main__":
    main()
