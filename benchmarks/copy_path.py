"""Host CPU a replica's byte costs on its way: sealed, sent, received, opened and put where it stays.

A confined device pays for its replicas out of the quota it computes with
(docs/pipeline.md, "What safety costs, in the cost model"), so every
nanosecond a byte costs on the host is ten on a 0.1-core Jetson Nano. Here
a whole MobileNetV2's weights and momentum (10 classes) travel as a replica
does, in one process: one sealed TCP link on loopback (AES-256-GCM both
ways, :mod:`ecofl.net.sealed`), the byte stream's pieces posted in the
background, paced at the testbed's 100 Mbps or not paced, these ways:

- **copied**: a tensor of its own each at both ends, the sender's pieces
  across tensors gathered into new memory, every piece opened into new
  memory and copied into the receiver's tensors, the receiving thread
  checking for a stop every 20 ms (the links' ``POLL_S``) while it waits,
  a paced piece what the link carries in 50 ms: the runtime before
  2026-12-03;
- **in place, 50 ms pieces**: both ends' tensors laid end to end as the
  stream carries them (:func:`~ecofl.pipeline.runtime.byte_stream.stream_buffers`,
  as a committed copy and a replica's buffers are), every piece a view of
  the sender's block, opened straight into the receiver's
  (:func:`~ecofl.pipeline.runtime.byte_stream.opened_in_place`), the
  receiving thread checking unwoken once a second (``STOP_CHECK_S``: a stop
  wakes it): the runtime of 2026-12-03 01:58;
- **in place**: as the last, a paced piece what the link carries in
  ``PIECE_S`` (200 ms), as a replica travels now.

Not paced, a piece is 4 MiB whatever ``PIECE_S`` says, so only the first
and the last way are measured there.

They take turns, fresh buffers each time as a sync-round allocates them,
in a process that keeps its freed memory as the workers do
(:mod:`ecofl.allocator`); the first transfer of each is not counted. Each
thread's CPU is read from its own clock (:mod:`ecofl.pipeline.runtime.thread_cpu`):
the sender (``send-to``: pacing, sealing, the socket), the reader
(``recv-from``: the socket, opening), and the receiving thread (``MainThread``:
cutting and posting the pieces, then putting them in place).

``python benchmarks/copy_path.py [--repeats 6]`` writes
``benchmarks/results/copy_path.json`` and a table in ``docs/pipeline.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torchvision  # noqa: E402

from benchmarks.markdown_section import publish  # noqa: E402
from ecofl.allocator import keep_freed_memory  # noqa: E402
from ecofl.net.links import POLL_S  # noqa: E402
from ecofl.pipeline.runtime.byte_stream import PIECE_S, stream_buffers  # noqa: E402
from ecofl.pipeline.runtime.copy_cost import LINK_BPS, LinkedPair, send_replica  # noqa: E402
from ecofl.pipeline.runtime.replica import STOP_CHECK_S  # noqa: E402
from ecofl.pipeline.runtime.thread_cpu import ThreadClock  # noqa: E402

#: way -> (opened in place, the receiver's poll, a paced piece's seconds)
WAYS = {"copied": (False, POLL_S, 0.05), "in place, 50 ms pieces": (True, STOP_CHECK_S, 0.05),
        "in place": (True, STOP_CHECK_S, PIECE_S)}
NOT_PACED = ("copied", "in place")  # not paced, a piece is MAX_PIECE_BYTES either way


def model_state() -> dict[str, torch.Tensor]:
    """MobileNetV2's (10 classes) state and a momentum buffer per parameter: what its replicas carry."""
    model = torchvision.models.mobilenet_v2(num_classes=10)
    state = {key: value.detach().clone() for key, value in model.state_dict().items()}
    state.update({f"momentum/{key}": torch.randn_like(p) for key, p in model.named_parameters()})
    return state


def transfer(pair: LinkedPair, state: dict[str, torch.Tensor], way: str, paced: bool) -> dict:
    """One replica from rank 0 to rank 1: CPU seconds by thread job, wall seconds; checks every byte arrived."""
    in_place, poll_s, piece_s = WAYS[way]
    if in_place:
        sent, received = stream_buffers(state), stream_buffers(state)
        for key, value in state.items():
            sent[key].copy_(value)
    else:
        sent, received = state, {key: torch.empty_like(value) for key, value in state.items()}
    clock, start = ThreadClock(), time.monotonic()  # the sender's copy above is the commit's, not the path's
    send_replica(pair, sent, received, LINK_BPS if paced else None, in_place, poll_s, piece_s)
    wall, cpu = time.monotonic() - start, clock.by_job()
    if not all(torch.equal(state[key], received[key]) for key in state):
        raise RuntimeError("a replica arrived different from what was sent")
    return {"way": way, "paced": paced, "wall_s": wall, "cpu_s_by_job": cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=6, help="transfers of each kind counted (after one more)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    keep_freed_memory()
    state = model_state()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    load = os.getloadavg()[0]
    rows = []
    with LinkedPair() as pair:
        for repeat in range(args.repeats + 1):
            for paced in (True, False):
                for way in WAYS if paced else NOT_PACED:
                    row = transfer(pair, state, way, paced)
                    print(f"{way:>22} paced={paced} {row['wall_s']:.2f} s", file=sys.stderr)
                    if repeat:
                        rows.append(row)
    jobs = ("send-to", "recv-from", "MainThread")
    summary = []
    for paced in (True, False):
        for way in WAYS if paced else NOT_PACED:
            mine = [r for r in rows if r["paced"] == paced and r["way"] == way]
            per_byte = {job: statistics.median(r["cpu_s_by_job"].get(job, 0.0) for r in mine) / nbytes * 1e9
                        for job in jobs}
            total = statistics.median(sum(r["cpu_s_by_job"].values()) for r in mine) / nbytes * 1e9
            summary.append({"paced": paced, "way": way, "ns_per_byte": per_byte, "total_ns_per_byte": total,
                            "wall_s": statistics.median(r["wall_s"] for r in mine)})
    result = {"command": f"python benchmarks/copy_path.py --repeats {args.repeats}",
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "measured_at": time.strftime("%Y-%m-%d %H:%M"), "load_before": round(load, 2), "bytes": nbytes,
              "summary": summary, "transfers": rows}
    copied = {s["paced"]: s["total_ns_per_byte"] for s in summary if s["way"] == "copied"}
    lines = [
        f"Measured with `{result['command']}` on {result['machine']}, {result['measured_at']} (load "
        f"{result['load_before']} before), host speed: MobileNetV2's weights and momentum ({nbytes / 1e6:.1f} MB) "
        f"over one sealed TCP link on loopback in one process, the ways taking turns, {args.repeats} transfers "
        "each (medians; host CPU ns a byte, by thread).",
        "",
        "| link | way | sender | reader | receiver | all threads | against copied | wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {'100 Mbps, paced' if s['paced'] else 'not paced'} | {s['way']} | "
          f"{s['ns_per_byte']['send-to']:.2f} | {s['ns_per_byte']['recv-from']:.2f} | "
          f"{s['ns_per_byte']['MainThread']:.2f} | {s['total_ns_per_byte']:.2f} | "
          f"{s['total_ns_per_byte'] / copied[s['paced']] - 1:+.0%} | {s['wall_s']:.2f} |" for s in summary),
    ]
    publish(result, ROOT / "benchmarks" / "results" / "copy_path.json", "\n".join(lines),
            ROOT / "docs" / "pipeline.md", "copy_path")
    return 0


if __name__ == "__main__":
    sys.exit(main())
