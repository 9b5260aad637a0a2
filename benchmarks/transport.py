"""Data-plane benchmark: what sealing the home's tensor links costs, against gloo and plain TCP.

The pipeline runtime once moved activations and gradients with
torch.distributed's gloo backend, whose rendezvous store and connections
accept anyone who reaches their ports. It now moves them on links that prove
the home's secret and seal every record with AES-256-GCM
(:mod:`ecofl.net.mesh`). This benchmark measures, in one run, two processes
on loopback (no emulation, no link shaping: host speed):

- **gloo**: ``torch.distributed`` send/recv (the old data plane);
- **sealed**: two :class:`~ecofl.net.mesh.EpochMesh` ranks (the home's data plane);
- **plain TCP**: ``sendall`` / ``recv_into`` of length-prefixed bytes on a bare socket, the floor.

For each tensor size: the **round trip** (rank 0 sends, rank 1 sends the
same tensor back; median of ``--trips``) and the **streaming throughput**
(rank 0 sends ``--stream`` tensors back to back, rank 1 receives them all and
answers with one small ack; bytes / time). Transports alternate within each
repeat so a noisy neighbour hits them alike; the table gives the median over
repeats and each transport's ratio to gloo.

With ``--baseline-ref REF`` it also trains one pipeline (MobileNetV2, three
host-speed devices, no emulation) with this tree's runtime and with the
runtime of git revision REF (a temporary worktree), alternately, and reports
the sync-round time of each: the end-to-end cost of the change.

    .venv/bin/python benchmarks/transport.py [--repeats 3] [--baseline-ref 4655c59]

writes benchmarks/results/transport.json and the results section of docs/transport.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the benchmarks package

from benchmarks.markdown_section import replace_section  # noqa: E402
from ecofl.interrupt import sigterm_as_interrupt  # noqa: E402

SIZES = (4 << 10, 256 << 10, 4 << 20, 16 << 20)
TRANSPORTS = ("gloo", "sealed", "plain TCP")
SECRET = bytes(range(32))


# -- the three transports, one class each: send / recv of float32 tensors -----------------------


class Gloo:
    def __init__(self, rank: int, port: int):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # else gloo binds the interface of the host name
        store = torch.distributed.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))
        self.pg = torch.distributed.ProcessGroupGloo(store, rank, 2, timedelta(seconds=60))
        self.peer = 1 - rank

    def send(self, tensor: torch.Tensor) -> None:
        self.pg.send([tensor], self.peer, 0).wait()

    def recv(self, like: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(like)
        self.pg.recv([out], self.peer, 0).wait()
        return out

    def close(self) -> None:
        pass


class Sealed:
    def __init__(self, rank: int, addresses: list[tuple[str, int]], listener):
        from ecofl.net.mesh import EpochMesh

        self.mesh = EpochMesh(listener, SECRET, 0, rank, addresses, timeout_s=60)
        self.peer = 1 - rank

    def send(self, tensor: torch.Tensor) -> None:
        self.mesh.send(self.peer, tensor, 0).wait(60)

    def recv(self, like: torch.Tensor) -> torch.Tensor:
        return self.mesh.recv(self.peer, 0, timeout_s=60)

    def close(self) -> None:
        self.mesh.close()


class PlainTCP:
    _LENGTH = struct.Struct(">Q")

    def __init__(self, rank: int, port: int):
        if rank == 0:
            with socket.create_server(("127.0.0.1", port)) as server:
                self.sock, _ = server.accept()
        else:
            deadline = time.time() + 60
            while True:
                try:
                    self.sock = socket.create_connection(("127.0.0.1", port))
                    break
                except OSError:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, tensor: torch.Tensor) -> None:
        payload = tensor.contiguous().view(-1).view(torch.uint8).numpy()
        self.sock.sendall(self._LENGTH.pack(payload.nbytes))
        self.sock.sendall(memoryview(payload))

    def recv(self, like: torch.Tensor) -> torch.Tensor:
        (length,) = self._LENGTH.unpack(self._exactly(bytearray(8)))
        out = torch.empty(length, dtype=torch.uint8)
        self._exactly(memoryview(out.numpy()))
        return out.view(like.dtype).view(like.shape)

    def _exactly(self, buffer):
        view, got = memoryview(buffer).cast("B"), 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("closed")
            got += n
        return buffer

    def close(self) -> None:
        self.sock.close()


# -- one measurement process per rank ------------------------------------------------------------


def _rank_main(rank: int, transport: str, setup: dict, sizes: tuple[int, ...], trips: int, stream: int,
               results) -> None:
    torch.set_num_threads(1)
    listener = None
    if transport == "gloo":
        link = Gloo(rank, setup["port"])
    elif transport == "plain TCP":
        link = PlainTCP(rank, setup["port"])
    else:
        from ecofl.net.mesh import DataListener

        listener = DataListener("127.0.0.1", SECRET)
        setup["addresses"][rank] = listener.address
        while len(setup["addresses"]) < 2:
            time.sleep(0.01)
        link = Sealed(rank, [setup["addresses"][r] for r in range(2)], listener)
    measured = {}
    ack = torch.zeros(1)
    for size in sizes:
        tensor = torch.randn(size // 4)
        for _ in range(2):  # warm up both directions
            _trip(link, rank, tensor)
        times = []
        for _ in range(trips):
            start = time.perf_counter()
            _trip(link, rank, tensor)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        if rank == 0:
            for _ in range(stream):
                link.send(tensor)
            link.recv(ack)
        else:
            for _ in range(stream):
                link.recv(tensor)
            link.send(ack)
        streaming = time.perf_counter() - start
        measured[size] = {"round_trip_s": statistics.median(times), "stream_bytes_per_s": stream * size / streaming}
    link.close()
    if listener is not None:
        listener.close()
    if rank == 0:
        results.update(measured)


def _trip(link, rank: int, tensor: torch.Tensor) -> None:
    if rank == 0:
        link.send(tensor)
        link.recv(tensor)
    else:
        link.send(link.recv(tensor))


def measure_transport(transport: str, sizes: tuple[int, ...], trips: int, stream: int) -> dict:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        results = manager.dict()
        setup = manager.dict({"port": _free_port(), "addresses": manager.dict()})
        ranks = [context.Process(target=_rank_main, args=(r, transport, setup, sizes, trips, stream, results))
                 for r in range(2)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join(timeout=600)
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
        if any(p.exitcode != 0 for p in ranks):
            raise RuntimeError(f"{transport}: a measurement process failed")
        return dict(results)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        return sock.getsockname()[1]


# -- the end-to-end comparison against an older runtime -------------------------------------------

PIPELINE_SCRIPT = r"""
import json, statistics, sys, time, torch
from ecofl.devices import DeviceSpec, HomePool
from ecofl.pipeline.planners import make_plan
from ecofl.pipeline.profile import profile_zoo_model
from ecofl.pipeline.runtime import HomePipeline, ZooModel
torch.set_num_threads(1)
rounds, batch = int(sys.argv[1]), int(sys.argv[2])
profile = profile_zoo_model("mobilenet_v2", (3, 32, 32), 10, "block", sys.argv[3])
host = DeviceSpec("host", 1.0, 4 << 30, 1e9)
pool = HomePool("host-3", (host, host, host))
plan = make_plan("even", profile, pool, batch, micro_batch=batch // 4)
g = torch.Generator().manual_seed(0)
x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
with HomePipeline(ZooModel("mobilenet_v2", (3, 32, 32), 10, "block"), pool, plan, emulate="none") as home:
    result = home.train(None, x, y, rounds, lr=0.01)
print(json.dumps({"sync_round_s": statistics.median(result.sync_round_s[1:])}))
"""


def pipeline_round(tree: Path, rounds: int, batch: int, cache_dir: str) -> float:
    """Median sync-round of the fixed pipeline with the runtime of ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PIPELINE_SCRIPT, str(rounds), str(batch), cache_dir], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the pipeline run in {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["sync_round_s"]


def compare_runtimes(ref: str, repeats: int, rounds: int, batch: int) -> dict:
    """This tree's runtime against ``ref``'s, alternating, on the same pipeline."""
    with tempfile.TemporaryDirectory(prefix="ecofl-baseline-") as scratch:
        worktree = Path(scratch) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), ref], check=True,
                       capture_output=True)
        try:
            cache = str(Path(scratch) / "profiles")
            times: dict[str, list[float]] = {"this tree": [], ref: []}
            for _ in range(repeats):
                times["this tree"].append(pipeline_round(ROOT, rounds, batch, cache))
                times[ref].append(pipeline_round(worktree, rounds, batch, cache))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)
    return {"ref": ref, "sync_round_s": times,
            "ratio": [old / new for new, old in zip(times["this tree"], times[ref])]}


# -- report ---------------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def markdown(report: dict) -> str:
    rows = report["transports"]
    lines = [
        f"Measured {report['date']} on {report['machine']} (load average {report['load']}), "
        f"{report['repeats']} alternating repeats, medians; two processes on loopback, no emulation, "
        "no link shaping. Ratio = gloo's time / the transport's time (above 1: faster than gloo).",
        "",
        "| tensor | " + " | ".join(f"{t} round trip (ms)" for t in TRANSPORTS)
        + " | " + " | ".join(f"{t} stream (MB/s)" for t in TRANSPORTS) + " | sealed vs gloo (round trip) "
        "| sealed vs gloo (stream) |",
        "|---|" + "---:|" * (2 * len(TRANSPORTS) + 2),
    ]
    for size in SIZES:
        rt = {t: statistics.median(r[str(size)]["round_trip_s"] for r in rows[t]) for t in TRANSPORTS}
        bw = {t: statistics.median(r[str(size)]["stream_bytes_per_s"] for r in rows[t]) for t in TRANSPORTS}
        lines.append(
            f"| {_size(size)} | " + " | ".join(f"{rt[t] * 1e3:.3f}" for t in TRANSPORTS) + " | "
            + " | ".join(f"{bw[t] / 1e6:.0f}" for t in TRANSPORTS)
            + f" | {rt['gloo'] / rt['sealed']:.2f}x | {bw['sealed'] / bw['gloo']:.2f}x |"
        )
    pipeline = report.get("pipeline")
    if pipeline:
        new, old = pipeline["sync_round_s"]["this tree"], pipeline["sync_round_s"][pipeline["ref"]]
        lines += [
            "",
            f"End to end (MobileNetV2, 3 host-speed devices, even partition, batch {report['batch']} in 4 "
            f"micro-batches, no emulation): median sync-round {statistics.median(new):.3f} s with the sealed "
            f"data plane against {statistics.median(old):.3f} s with gloo (revision {pipeline['ref']}); "
            f"per repeat, gloo's time / sealed time = "
            + ", ".join(f"{r:.2f}" for r in pipeline["ratio"]) + ".",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trips", type=int, default=20, help="round trips per size (median)")
    parser.add_argument("--stream", type=int, default=20, help="tensors per streaming measurement")
    parser.add_argument("--baseline-ref", default=None, help="git revision whose runtime to compare end to end")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "transport.json"))
    args = parser.parse_args(argv)
    rows: dict[str, list[dict]] = {t: [] for t in TRANSPORTS}
    for repeat in range(args.repeats):
        for transport in TRANSPORTS:
            measured = measure_transport(transport, SIZES, args.trips, args.stream)
            rows[transport].append({str(k): v for k, v in measured.items()})
            print(f"repeat {repeat + 1}/{args.repeats} {transport}: " + ", ".join(
                f"{_size(s)} rt {v['round_trip_s'] * 1e3:.2f} ms, {v['stream_bytes_per_s'] / 1e6:.0f} MB/s"
                for s, v in measured.items()), flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()), "repeats": args.repeats, "batch": args.batch,
        "transports": rows,
    }
    if args.baseline_ref:
        report["pipeline"] = compare_runtimes(args.baseline_ref, args.repeats, args.rounds, args.batch)
    table = markdown(report)
    print(table)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2))
    if not replace_section(ROOT / "docs" / "transport.md", table):
        print("docs/transport.md has no benchmark section; table not written there", file=sys.stderr)
    return 0


if __name__ == "__main__":
    with sigterm_as_interrupt():  # `kill` unwinds as Ctrl-C: workers and namespaces are cleaned up
        sys.exit(main())
