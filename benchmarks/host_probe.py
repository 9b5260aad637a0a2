"""The host's speed while a benchmark runs: a process timing one small fixed piece of work, again and again.

:func:`benchmarks.steady_runs.host_reference_s` times the host before and
after a run, with nothing else running. On this shared virtual machine a
confined run has missed its prediction with its devices, timed alone just
before and just after it, agreeing with their calibration (docs/pipeline.md,
the confined runs): whatever slowed them came during the run. A
:class:`HostProbe` runs beside the work it brackets: a process on one torch
thread timing one 3x3 convolution of 8 x 32 x 28 x 28 (about 1.5 ms of CPU)
every quarter of a second, about 1% of a core. It keeps freed memory for
reuse as a worker does (:func:`ecofl.allocator.keep_freed_memory`). Without
that the same work took 1.5-1.6 ms in about one fresh process of eight (20
of 168 counted) and 2.8-2.9 ms in the others, each steady for its life, on
either core and at any moment (2026-12-05 17:08-18:45): the slow ones took
556 page faults a call and the fast ones none (glibc's malloc handing the
call's freed blocks back to the kernel, or keeping them, by the state of its
heap; oneDNN's verbose log put the difference in the reorders into fresh
memory, 0.36-0.40 against 0.06 ms, and the convolution, 1.35 against 1.0
ms). With it every process read 1.53-1.61 ms. Each sample is the CPU seconds
of the same work at that moment (``time.thread_time``: waiting for a core is
not counted, a core that computes slower is), so the medians of the samples
taken during a calibration and during the run it predicts say whether the
run met a slower host.

    with HostProbe() as probe:
        ...  # the work it brackets
    probe.summary()  # {"median_s": ..., "quartiles_s": [...], "samples": ...}

``python benchmarks/host_probe.py [--interval 0.25]`` is the probe itself:
one line per sample (when it ended on the system's monotonic clock, and its
CPU seconds) until it is stopped.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

INTERVAL_S = 0.25
STOP_WAIT_S = 5.0


class HostProbe:
    """A probe process for the span of a ``with`` block; its samples' summary after it (see the module)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.taken_at: list[float] = []  # each sample's end, on the system's monotonic clock (``time.monotonic``)
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> HostProbe:
        self._process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--interval",
                                          str(self.interval_s)], stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, name="host-probe-reader", daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._process is not None and self._reader is not None
        self._process.terminate()
        try:
            self._process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._reader.join()

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            taken_at, cpu_s = map(float, line.split())
            self.taken_at.append(taken_at)
            self.samples.append(cpu_s)

    def summary(self, since: float | None = None) -> dict:
        """The probe's samples over the block, or those taken from ``since`` (``time.monotonic``) on, summarised
        (:func:`summarize`)."""
        return summarize([s for s, at in zip(self.samples, self.taken_at) if since is None or at >= since])


def summarize(samples: list[float]) -> dict:
    """The median CPU seconds of the probe's work, its quartiles and how many samples (no median under two)."""
    if len(samples) < 2:
        return {"median_s": None, "quartiles_s": None, "samples": len(samples)}
    quartiles = statistics.quantiles(samples, n=4)
    return {"median_s": statistics.median(samples), "quartiles_s": [quartiles[0], quartiles[2]],
            "samples": len(samples)}


def relative_speed(during: dict | None, reference: dict | None) -> float | None:
    """How much longer the probe's work took ``during`` something than during the ``reference`` (0.1: 10%
    slower); ``None`` where either has no median."""
    if not during or not reference or during["median_s"] is None or reference["median_s"] is None:
        return None
    return during["median_s"] / reference["median_s"] - 1


def probe(interval_s: float) -> None:
    """Time the fixed work every ``interval_s``, printing each sample's CPU seconds, until stopped."""
    import torch

    from ecofl.allocator import keep_freed_memory

    keep_freed_memory()  # as a worker does: the work's freed blocks are reused, not faulted in again
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    x, conv = torch.randn(8, 32, 28, 28, generator=generator), torch.nn.Conv2d(32, 32, 3, padding=1)
    with torch.no_grad():
        for _ in range(3):  # first calls allocate and pick kernels
            conv(x)
        while True:
            start = time.thread_time()
            conv(x)
            cpu_s = time.thread_time() - start
            print(f"{time.monotonic():.3f} {cpu_s:.6f}", flush=True)
            time.sleep(interval_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples")
    args = parser.parse_args()
    try:
        probe(args.interval)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
